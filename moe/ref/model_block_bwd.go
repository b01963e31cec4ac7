package ref

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/attn"
	"github.com/moescope/moescope/moe/kernel"
)

// Backward takes dy [T,D], the gradient of the block's output, recomputes
// what the checkpointing policy dropped (recorded as Recompute), accumulates
// the layer's weight gradients into g and returns the gradient of the
// block's input. auxGrad[b·E+e], when non-nil, is ∂loss/∂s_{t,e} of the
// load-balancing loss for every token t of sequence b (it depends on the
// routing of the whole micro-batch, so the caller computes it: AuxLoss).
// The block's kept state is released.
func (b *Block[T]) Backward(w, g *LayerWeights[T], dy, auxGrad []T) []T {
	c, ex, L := b.cfg, b.x, b.layer
	if len(dy) != b.tokens()*c.Hidden || b.st.x == nil {
		panic("moe: Block.Backward needs a preceding Forward and dy of batch·seq·hidden elements")
	}
	if !b.st.complete {
		b.local.w = w
		b.forward(w, moe.Recompute, b.st.cache != nil)
	}
	b.local.w, b.local.g = w, g
	st := &b.st
	T_, D := b.tokens(), c.Hidden
	t64 := int64(T_)

	// out = x2 + ffn(h2): dx2 = dy + ffn_norm backward of dh2.
	st.h2, st.rstd2 = b.recomputeNorm(moe.OpFFNNorm, st.h2, st.rstd2, st.x2, w.FFNNorm)
	dh2 := b.buf(T_ * D)
	if c.MoELayer[L] {
		if st.rt == nil {
			// moe: the MoE layer's forward again from its kept input,
			// all-to-alls included, before its backward (Megatron's
			// CheckpointFunction.backward); its output is not needed.
			b.moeForward(w, b.buf(T_*D), moe.Recompute, false)
		}
		b.moeBackward(w, g, dh2, dy, auxGrad)
	} else {
		b.swigluBack(&st.ffn, moe.OpDenseGate, moe.OpDenseUp, moe.OpDenseAct, moe.OpDenseDown,
			w.DenseGate, w.DenseUp, w.DenseDown, g.DenseGate, g.DenseUp, g.DenseDown, c.DenseFFN, dh2, dy)
	}
	dx2 := make([]T, T_*D) // becomes dx, which escapes to the caller: not scratch
	copy(dx2, dy)
	rmsNormBwd(dx2, g.FFNNorm, dh2, st.x2, st.rstd2, w.FFNNorm, D)
	ex.op(L, moe.OpFFNNorm, moe.BackwardData, t64*int64(D))
	ex.op(L, moe.OpFFNNorm, moe.BackwardWeight, t64*int64(D))

	// x2 = x + o_proj(attention(...))
	st.h1, st.rstd1 = b.recomputeNorm(moe.OpAttnNorm, st.h1, st.rstd1, st.x, w.AttnNorm)
	dh1 := b.attentionBackward(w, g, dx2)
	dx := dx2
	rmsNormBwd(dx, g.AttnNorm, dh1, st.x, st.rstd1, w.AttnNorm, D)
	ex.op(L, moe.OpAttnNorm, moe.BackwardData, t64*int64(D))
	ex.op(L, moe.OpAttnNorm, moe.BackwardWeight, t64*int64(D))
	b.st = blockState[T]{}
	b.scratch.Release()
	return dx
}

// recomputeNorm returns the output and rstd of the norm op on x [T,D]
// with weight nw: h and rstd when forward kept them, else recomputed (the
// modules policy's layernorm, recorded as Recompute) at the start of its
// consumer's backward, where Megatron's gradient hook runs it.
func (b *Block[T]) recomputeNorm(op moe.Op, h, rstd, x, nw []T) ([]T, []T) {
	if h != nil {
		return h, rstd
	}
	D := b.cfg.Hidden
	h, rstd = b.buf(len(x)), b.buf(len(x)/D)
	rmsNormFwd(h, rstd, x, nw, D, b.cfg.NormEps)
	b.x.round(h)
	b.x.op(b.layer, op, moe.Recompute, int64(len(x)))
	return h, rstd
}

// attentionBackward returns the gradient of the normed input h1 from dout,
// the gradient of o_proj's output over all T tokens: o_proj, attention and
// the projections into it (MLA's or the standard q, k, v) in reverse.
func (b *Block[T]) attentionBackward(w, g *LayerWeights[T], dout []T) []T {
	c, ex, L, st := b.cfg, b.x, b.layer, &b.st
	T_, D, H, G, d := b.tokens(), c.Hidden, c.Heads, c.KVHeads, c.HeadDim
	dvh := c.VHeadDim()
	do := b.buf(T_ * H * dvh)
	linearBack(ex, L, moe.OpOProj, do, g.Wo, g.Bo, dout, st.o, w.Wo, T_, D, H*dvh)
	dq, dk, dv := b.buf(T_*H*d), b.buf(T_*G*d), b.buf(T_*G*dvh)
	a := b.attnShape()
	area := int64(b.batch) * a.Area()
	if b.Attention != nil {
		area = b.Attention.AttentionBackward(L, dq, dk, dv, do, st.q, st.k, st.v, st.o, st.lse, a)
	} else {
		attn.Backward(dq, dk, dv, do, st.q, st.k, st.v, st.o, st.lse, a)
	}
	if w.Sinks != nil {
		attn.SinksBackward(g.Sinks, w.Sinks, do, st.o, st.lse, a)
	}
	n := int64(H) * area
	ex.op(L, moe.OpAttn, moe.Recompute, n*int64(d))
	ex.op(L, moe.OpAttn, moe.BackwardData, 2*n*int64(d+dvh))
	dh1 := b.buf(T_ * D)
	if c.IsMLA() {
		b.mlaBackward(w, g, dh1, dq, dk, dv)
	} else {
		b.qkvBackward(w, g, dh1, dq, dk, dv)
	}
	return dh1
}

// qkvBackward accumulates into dh1 the gradient of the normed input from
// the attention inputs' gradients of a standard block: RoPE, QK-norm and
// the q, k, v projections in reverse.
func (b *Block[T]) qkvBackward(w, g *LayerWeights[T], dh1, dq, dk, dv []T) {
	c, st, ex, L := b.cfg, &b.st, b.x, b.layer
	T_, D, H, G, d := b.tokens(), c.Hidden, c.Heads, c.KVHeads, c.HeadDim
	q, kv := H*d, G*d
	t64 := int64(T_)
	if b.temp != nil {
		attn.ScaleQueries(dq, q, b.temp)
	}
	if c.QKNorm == moe.QKNormL2Rope && c.LayerQKNorm(L) {
		dqr, dkr := b.buf(T_*q), b.buf(T_*kv)
		attn.L2NormBackward(dqr, dq, st.qPre, st.qRstd, d)
		attn.L2NormBackward(dkr, dk, st.kPre, st.kRstd, d)
		ex.op(L, moe.OpQNorm, moe.BackwardData, t64*int64(q))
		ex.op(L, moe.OpKNorm, moe.BackwardData, t64*int64(kv))
		dq, dk = dqr, dkr
	}
	if c.Roped(L) {
		b.rope.Apply(dq, H, d, b.seq, true)
		b.rope.Apply(dk, G, d, b.seq, true)
		ex.op(L, moe.OpRoPE, moe.BackwardData, t64*int64(H+G)*int64(c.RotaryDim()))
	}
	if c.QKNorm == moe.QKNormHead || c.QKNorm == moe.QKNormFull {
		wq, wk := d, d
		if c.QKNorm == moe.QKNormFull {
			wq, wk = q, kv
		}
		dqr, dkr := b.buf(T_*q), b.buf(T_*kv)
		rmsNormBwd(dqr, g.QNorm, dq, st.qRaw, st.qRstd, w.QNorm, wq)
		rmsNormBwd(dkr, g.KNorm, dk, st.kRaw, st.kRstd, w.KNorm, wk)
		ex.op(L, moe.OpQNorm, moe.BackwardData, t64*int64(q))
		ex.op(L, moe.OpQNorm, moe.BackwardWeight, t64*int64(q))
		ex.op(L, moe.OpKNorm, moe.BackwardData, t64*int64(kv))
		ex.op(L, moe.OpKNorm, moe.BackwardWeight, t64*int64(kv))
		dq, dk = dqr, dkr
	}
	linearBack(ex, L, moe.OpQProj, dh1, g.Wq, g.Bq, dq, st.h1, w.Wq, T_, q, D)
	linearBack(ex, L, moe.OpKProj, dh1, g.Wk, g.Bk, dk, st.h1, w.Wk, T_, kv, D)
	linearBack(ex, L, moe.OpVProj, dh1, g.Wv, g.Bv, dv, st.h1, w.Wv, T_, kv, D)
}

// swigluBack back-propagates dy through a SwiGLU on h2, accumulating dh2.
func (b *Block[T]) swigluBack(s *ffnActs[T], opG, opU, opA, opD moe.Op, wg, wu, wd, gg, gu, gd []T, f int, dh2, dy []T) {
	T_, D, ex, L := b.tokens(), b.cfg.Hidden, b.x, b.layer
	da := b.buf(T_ * f)
	linearBack(ex, L, opD, da, gd, nil, dy, s.a, wd, T_, D, f)
	dg, du := b.buf(T_*f), b.buf(T_*f)
	swigluActBwd(dg, du, da, *s)
	ex.op(L, opA, moe.BackwardData, int64(T_)*int64(f))
	linearBack(ex, L, opG, dh2, gg, nil, dg, b.st.h2, wg, T_, f, D)
	linearBack(ex, L, opU, dh2, gu, nil, du, b.st.h2, wu, T_, f, D)
}

// moeBackward accumulates into dhTD the gradient of the normed input h2
// [T,D] from dyTD, moeForward in reverse: the shared experts, then
// combine → experts → dispatch → router.
func (b *Block[T]) moeBackward(w, g *LayerWeights[T], dhTD, dyTD, auxGrad []T) {
	if b.cfg.SharedExperts > 0 {
		b.sharedBackward(w, g, dhTD, dyTD)
	}
	meta := metaOf(b.st.rt)
	dExpertOutTKD, dWeightsTK := b.combineBackward(dyTD, meta)
	dxTKD := b.expertsBackward(dExpertOutTKD)
	b.dispatchBackward(dhTD, b.st.h2, dxTKD, dWeightsTK, meta)
	b.routerBackward(w, g, dhTD, dWeightsTK, auxGrad)
}

// sharedBackward back-propagates dyTD through the (σ-gated) shared
// experts, accumulating dhTD.
func (b *Block[T]) sharedBackward(w, g *LayerWeights[T], dhTD, dyTD []T) {
	c, st, ex, L := b.cfg, &b.st, b.x, b.layer
	nTok, D := b.tokens(), c.Hidden
	S := c.SharedExperts * c.SharedFFN
	dSharedTD := dyTD
	if c.SharedGated {
		dSharedTD = b.buf(nTok * D)
		dGateLogitT := b.buf(nTok)
		for t := 0; t < nTok; t++ {
			sg := st.sGate[t]
			var dot T
			for j := 0; j < D; j++ {
				dSharedTD[t*D+j] = sg * dyTD[t*D+j]
				dot += dyTD[t*D+j] * st.fOut[t*D+j]
			}
			dGateLogitT[t] = dot * sg * (1 - sg)
		}
		ex.op(L, moe.OpSharedScale, moe.BackwardData, int64(nTok)*int64(D))
		linearBack(ex, L, moe.OpSharedExpGate, dhTD, g.SharedExpGate, nil, dGateLogitT, st.h2, w.SharedExpGate, nTok, 1, D)
	}
	b.swigluBack(&st.ffn, moe.OpSharedGate, moe.OpSharedUp, moe.OpSharedAct, moe.OpSharedDown,
		w.SharedGate, w.SharedUp, w.SharedDown, g.SharedGate, g.SharedUp, g.SharedDown, S, dhTD, dSharedTD)
}

// combineBackward returns the gradients of the expert outputs [T·K, D]
// (each token's gradient times the row's weight) and of the routing
// weights [T,K] (the gradient's dot product with the row).
func (b *Block[T]) combineBackward(dyTD []T, meta dispatchMeta[T]) (dExpertOutTKD, dWeightsTK []T) {
	D, K := b.cfg.Hidden, b.cfg.TopK
	rows := len(meta.orderTK)
	dExpertOutTKD, dWeightsTK = b.stageBuf(rows*D), b.buf(rows)
	kernel.ParallelFor(rows, 2*D, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			tk := meta.orderTK[r]
			t, wt := int(tk)/K, meta.outWeight(b.cfg, int32(r))
			dyD, dOutD, outD := dyTD[t*D:t*D+D], dExpertOutTKD[r*D:r*D+D], b.st.expertOutTKD[r*D:r*D+D]
			var dot T
			for j := range dyD {
				dOutD[j] = wt * dyD[j]
				dot += dyD[j] * outD[j]
			}
			if !b.cfg.RouteInput { // else dispatchBackward's
				dWeightsTK[tk] = dot
			}
		}
	})
	b.x.op(b.layer, moe.OpCombine, moe.BackwardData, int64(rows)*int64(D))
	return dExpertOutTKD, dWeightsTK
}

// expertsBackward returns the gradient of the dispatched rows [T·K, D]
// and accumulates the experts' weight gradients (locally, or through
// Block.Experts).
func (b *Block[T]) expertsBackward(dExpertOutTKD []T) []T {
	if b.Experts != nil {
		return b.Experts.ExpertsBackward(b.layer, dExpertOutTKD)
	}
	return b.local.ExpertsBackward(b.layer, dExpertOutTKD)
}

// dispatchBackward adds each dispatched row's gradient to its token's row
// of dhTD; under RouteInput (row = w·h) the gradient times w, and the
// weight's gradient dW = dx·h (h the token's row of hTD) into dWeightsTK.
func (b *Block[T]) dispatchBackward(dhTD, hTD, dxTKD, dWeightsTK []T, meta dispatchMeta[T]) {
	D, K := b.cfg.Hidden, b.cfg.TopK
	rowTK := meta.rowsByToken(K)
	kernel.ParallelFor(len(rowTK)/K, K*D, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			dstD := dhTD[t*D : t*D+D]
			for _, r := range rowTK[t*K : t*K+K] {
				dx, wt := dxTKD[int(r)*D:int(r)*D+D], T(1) // 1·x is x: the bits of dst + x
				if tk := meta.orderTK[r]; b.cfg.RouteInput {
					dWeightsTK[tk], wt = dot(dx, hTD[t*D:t*D+D]), meta.weightsTK[tk]
				}
				axpy(dstD, dx, wt)
			}
		}
	})
	b.x.op(b.layer, moe.OpDispatch, moe.BackwardData, int64(len(meta.orderTK))*int64(D))
}

// routerBackward turns the weights' gradient [T,K] and the aux loss's
// gradient of the scores (auxGrad [B,E], nil when off) into the logits'
// gradient, accumulating dhTD and the router weight's gradient.
func (b *Block[T]) routerBackward(w, g *LayerWeights[T], dhTD, dWeightsTK, auxGrad []T) {
	c, st, ex, L := b.cfg, &b.st, b.x, b.layer
	nTok, D, E := b.tokens(), c.Hidden, c.Experts
	dScoresTE := b.buf(nTok * E)
	if auxGrad != nil {
		for t := 0; t < nTok; t++ {
			sq := t / b.seq * E
			copy(dScoresTE[t*E:t*E+E], auxGrad[sq:sq+E])
		}
		ex.op(L, moe.OpAuxLoss, moe.BackwardData, int64(nTok)*int64(E))
	}
	dLogitsTE := b.buf(nTok * E)
	routeBwd(c, st.rt, dLogitsTE, dScoresTE, dWeightsTK)
	ex.op(L, moe.OpRouterTopK, moe.BackwardData, int64(nTok)*int64(E))
	linearBack(ex, L, moe.OpRouter, dhTD, g.Router, g.RouterBias, dLogitsTE, st.h2, w.Router, nTok, E, D)
}
