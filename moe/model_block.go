package moe

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/moe/attn"
	"github.com/moescope/moescope/moe/kernel"
)

// LayerWeights holds the tensors of one decoder layer as flat row-major
// slices in Hugging Face's shapes ([out, in] for linear weights). Absent
// tensors (no bias, no QK-norm, dense instead of MoE, …) are nil. The same
// type carries gradients. An expert-parallel rank may leave ExpGate,
// ExpUp and ExpDown nil for experts it does not hold, as long as its
// ExpertStage never asks for them.
type LayerWeights[T Float] struct {
	AttnNorm, FFNNorm []T // [D]
	Wq, Bq            []T // [H·d, D], [H·d]
	Wk, Bk            []T // [G·d, D], [G·d]
	Wv, Bv            []T // [G·d, D], [G·d]
	Wo                []T // [D, H·d]
	QNorm, KNorm      []T // [d] (per head) or [H·d], [G·d] (full width)
	// Multi-head latent attention (mla.go; Wq is q_proj when there is no
	// query latent, Wo is [D, H·v]): q_a_proj [Rq, D], q_a_layernorm [Rq],
	// q_b_proj [H·(n+r), Rq], kv_a_proj_with_mqa [Rkv+r, D], kv_a_layernorm
	// [Rkv], kv_b_proj [H·(n+v), Rkv].
	WqA, QANorm, WqB, WkvA, KVANorm, WkvB []T

	Router  []T // [E, D]
	SelBias []T // [E], selection bias (a buffer: no gradient)
	// Routed experts, indexed by global expert: [F, D], [F, D], [D, F].
	ExpGate, ExpUp, ExpDown [][]T
	// Shared experts fused into one SwiGLU of width S = SharedExperts·SharedFFN.
	SharedGate, SharedUp, SharedDown []T // [S, D], [S, D], [D, S]
	SharedExpGate                    []T // [1, D] (Qwen2-MoE's σ gate)
	DenseGate, DenseUp, DenseDown    []T // [Fd, D], [Fd, D], [D, Fd]
}

// ExpertStage runs the routed experts of one MoE layer: the seam between
// dispatch and combine where expert parallelism exchanges rows by
// all-to-all. xTKD holds Σ counts = T·K rows of D elements in expert order
// (counts[e] rows for global expert e, e ascending, dropless); the result
// holds the expert outputs for the same rows in the same order. keep says
// whether Forward must keep what ExpertsBackward will read (false when the
// block, or under the modules policy's moe its MoE layer, is checkpointed
// and will call Forward again with pass Recompute before backward). ExpertsBackward receives the gradient of the rows of
// the last kept Forward of that layer, returns the gradient of xTKD and
// accumulates the experts' weight gradients. An implementation records its
// grouped GEMMs (expert_gate, expert_up, expert_down), expert_act and what
// it keeps, as the local one does. Under the modules policy's moe_act the
// local stage keeps the activation's inputs only (gate and up) and
// recomputes it at the start of ExpertsBackward.
type ExpertStage[T Float] interface {
	ExpertsForward(layer int, xTKD []T, counts []int, pass Pass, keep bool) []T
	ExpertsBackward(layer int, dyTKD []T) []T
}

// blockState is what one block holds between its forward and backward.
// complete says it holds everything backward reads (policy none, or after
// recomputation); otherwise only x and the selective cache are held.
type blockState[T Float] struct {
	x, rstd1, h1             []T // block input [T,D], attn_norm rstd [T], normed [T,D]
	qRaw, qRstd, kRaw, kRstd []T // projections before QK-norm and the norms' rstd
	q, k, v                  []T // attention inputs [T,q], [T,kv], [T,kv]
	mla                      mlaActs[T]
	ao                       []T // o_proj output [T,D]
	o, lse                   []T // attention output [T,q], log-sum-exp [T,H]
	x2, rstd2, h2            []T // mid residual, ffn_norm rstd, normed [T,D]
	rt                       *Routing[T]
	topValTK                 []T // top-k values [T,K] (before renormalization)
	expertOutTKD             []T // routed expert outputs [T·K, D], in expert order
	ffn                      ffnActs[T]
	gl, sGate                []T // shared_expert_gate logits and σ [T]
	fOut                     []T // shared or dense FFN output [T,D]
	cache                    map[Op][]T
	complete                 bool
}

// Block runs one decoder layer: forward, checkpointing and backward. A
// Model owns one per layer; a parallel rank may build its own and drive it
// with weights it gathered. Forward and Backward alternate: Backward uses
// what the last Forward kept and releases it.
type Block[T Float] struct {
	cfg        *Config
	layer      int
	batch, seq int
	x          *exec
	ac         AC
	aux        bool
	rope       ropeTable[T]
	local      localExperts[T]
	// Experts, when non-nil, replaces the local execution of routed experts.
	Experts ExpertStage[T]
	st      blockState[T]
	// counts[e] = (token, slot) pairs routed to expert e in the last
	// forward; with the aux loss on, seqCounts[b·E+e] and seqScores[b·E+e]
	// = Σ_{t in sequence b} s_{t,e} per sequence (aux loss statistics).
	counts    []int
	seqCounts []int
	seqScores []T
}

// NewBlock returns the runner of decoder layer l for micro-batches of batch
// sequences of seq tokens.
func NewBlock[T Float](c *Config, l, batch, seq int, o Options) *Block[T] {
	b := &Block[T]{cfg: c, layer: l, batch: batch, seq: seq, x: newExec(o), ac: o.AC, aux: o.AuxCoef != 0}
	b.rope = newRopeTable[T](c, seq)
	b.local.b = b
	return b
}

// DeferWeightGrads makes the block's backwards queue their
// weight-gradient GEMMs on q (WeightQueue) until it is called with nil:
// the local experts' and every linear's. An ExpertStage replacing the
// local experts is handed q when it has a DeferWeightGrads(*WeightQueue)
// method (numeric's expert-parallel stage: it then queues its experts'
// GEMMs on q too); one without runs its backward whole.
func (b *Block[T]) DeferWeightGrads(q *WeightQueue) {
	b.x.wq = q
	if s, ok := b.Experts.(interface{ DeferWeightGrads(*WeightQueue) }); ok {
		s.DeferWeightGrads(q)
	}
}

// Routing returns the routing the block holds (nil for dense layers, and
// between forward and backward when the block or its MoE layer is
// checkpointed).
func (b *Block[T]) Routing() *Routing[T] { return b.st.rt }

// ExpertCounts returns the per-expert (token, slot) counts of the last
// forward (nil for dense layers).
func (b *Block[T]) ExpertCounts() []int { return b.counts }

func (b *Block[T]) tokens() int { return b.batch * b.seq }

func (b *Block[T]) attnShape() attn.Shape {
	c := b.cfg
	scale := c.AttnScale
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(c.HeadDim))
	}
	return attn.Shape{Batch: b.batch, Seq: b.seq, Heads: c.Heads, KV: c.KVHeads, D: c.HeadDim, DV: c.VHeadDim(),
		Window: c.Window[b.layer], TileQ: b.x.tileQ, TileK: b.x.tileK, Scale: scale}
}

// lin runs a linear op unless the selective cache holds its output.
func (b *Block[T]) lin(op Op, pass Pass, useCache bool, in, w, bias []T, m, n, k int) []T {
	if useCache {
		if y, ok := b.st.cache[op]; ok {
			return y
		}
	}
	y := make([]T, m*n)
	linear(b.x, b.layer, op, pass, y, in, w, bias, m, n, k)
	return y
}

// Forward runs the block on x [T,D] (T = batch·seq tokens) and returns its
// output; it keeps for backward what the checkpointing policy says.
func (b *Block[T]) Forward(w *LayerWeights[T], x []T) []T {
	if len(x) != b.tokens()*b.cfg.Hidden {
		panic("moe: Block.Forward needs x of batch·seq·hidden elements")
	}
	b.st = blockState[T]{x: x}
	b.local.w = w
	out := b.forward(w, Forward, false)
	b.keep()
	return out
}

// forward computes the block from b.st.x, filling b.st. useCache takes the
// selective cache's outputs instead of recomputing those ops.
func (b *Block[T]) forward(w *LayerWeights[T], pass Pass, useCache bool) []T {
	c, st, ex, L := b.cfg, &b.st, b.x, b.layer
	T_, D, H := b.tokens(), c.Hidden, c.Heads
	t64 := int64(T_)

	st.h1, st.rstd1 = make([]T, T_*D), make([]T, T_)
	rmsNormFwd(st.h1, st.rstd1, st.x, w.AttnNorm, D, c.NormEps)
	ex.round(st.h1)
	ex.op(L, OpAttnNorm, pass, t64*int64(D))

	if c.IsMLA() {
		b.mlaForward(w, pass, useCache)
	} else {
		b.qkvForward(w, pass, useCache)
	}
	b.attend(pass, useCache)
	st.ao = b.lin(OpOProj, pass, useCache, st.o, w.Wo, nil, T_, D, H*c.VHeadDim())

	st.x2 = make([]T, T_*D)
	addInto(st.x2, st.x, st.ao)
	ex.round(st.x2)
	st.h2, st.rstd2 = make([]T, T_*D), make([]T, T_)
	rmsNormFwd(st.h2, st.rstd2, st.x2, w.FFNNorm, D, c.NormEps)
	ex.round(st.h2)
	ex.op(L, OpFFNNorm, pass, t64*int64(D))

	y := make([]T, T_*D)
	if c.MoELayer[L] {
		b.moeForward(w, y, pass, useCache)
	} else {
		st.ffn = newFFNActs[T](T_, c.DenseFFN)
		st.fOut = b.swiglu(&st.ffn, pass, useCache, OpDenseGate, OpDenseUp, OpDenseAct, OpDenseDown,
			w.DenseGate, w.DenseUp, w.DenseDown, c.DenseFFN)
		copy(y, st.fOut)
	}
	out := make([]T, T_*D)
	addInto(out, st.x2, y)
	ex.round(out)
	ex.op(L, OpResidual, pass, 2*t64*int64(D))
	st.complete = true
	return out
}

// qkvForward computes the attention inputs q, k, v of a standard block
// from the normed input h1: projections, QK-norm and RoPE.
func (b *Block[T]) qkvForward(w *LayerWeights[T], pass Pass, useCache bool) {
	c, st, ex, L := b.cfg, &b.st, b.x, b.layer
	T_, D, H, G, d := b.tokens(), c.Hidden, c.Heads, c.KVHeads, c.HeadDim
	q, kv := H*d, G*d
	t64 := int64(T_)
	st.qRaw = b.lin(OpQProj, pass, useCache, st.h1, w.Wq, w.Bq, T_, q, D)
	st.kRaw = b.lin(OpKProj, pass, useCache, st.h1, w.Wk, w.Bk, T_, kv, D)
	st.v = b.lin(OpVProj, pass, useCache, st.h1, w.Wv, w.Bv, T_, kv, D)

	st.q, st.k = make([]T, T_*q), make([]T, T_*kv)
	switch c.QKNorm {
	case QKNormHead, QKNormFull:
		wq, wk := d, d
		if c.QKNorm == QKNormFull {
			wq, wk = q, kv
		}
		st.qRstd, st.kRstd = make([]T, T_*q/wq), make([]T, T_*kv/wk)
		rmsNormFwd(st.q, st.qRstd, st.qRaw, w.QNorm, wq, c.NormEps)
		rmsNormFwd(st.k, st.kRstd, st.kRaw, w.KNorm, wk, c.NormEps)
		ex.round(st.q)
		ex.round(st.k)
		ex.op(L, OpQNorm, pass, t64*int64(q))
		ex.op(L, OpKNorm, pass, t64*int64(kv))
	default:
		copy(st.q, st.qRaw)
		copy(st.k, st.kRaw)
	}
	b.rope.apply(st.q, H, d, b.seq, false)
	b.rope.apply(st.k, G, d, b.seq, false)
	ex.round(st.q)
	ex.round(st.k)
	ex.op(L, OpRoPE, pass, t64*int64(H+G)*int64(c.RotaryDim()))

}

// attend runs attention on q, k, v (or takes the selective cache's output).
func (b *Block[T]) attend(pass Pass, useCache bool) {
	c, st, L := b.cfg, &b.st, b.layer
	T_, H := b.tokens(), c.Heads
	a := b.attnShape()
	if o, ok := st.cache[OpAttn]; useCache && ok {
		st.o, st.lse = o, st.cache[opLSE]
		return
	}
	st.o, st.lse = make([]T, T_*H*a.DV), make([]T, T_*H)
	attn.Forward(st.o, st.lse, st.q, st.k, st.v, a)
	b.x.round(st.o)
	b.x.op(L, OpAttn, pass, int64(b.batch)*int64(H)*a.Area()*int64(a.D+a.DV))
}

// swiglu runs a shared or dense SwiGLU on h2 and returns its output [T,D].
func (b *Block[T]) swiglu(s *ffnActs[T], pass Pass, useCache bool, opG, opU, opA, opD Op, wg, wu, wd []T, f int) []T {
	T_, D := b.tokens(), b.cfg.Hidden
	s.g = b.lin(opG, pass, useCache, b.st.h2, wg, nil, T_, f, D)
	s.u = b.lin(opU, pass, useCache, b.st.h2, wu, nil, T_, f, D)
	swigluAct(*s)
	b.x.round(s.sg)
	b.x.round(s.a)
	b.x.op(b.layer, opA, pass, int64(T_)*int64(f))
	return b.lin(opD, pass, useCache, s.a, wd, nil, T_, D, f)
}

// moeForward adds the MoE layer's output to yTD [T,D]: the routed experts
// as router → dispatch → experts → combine, then the shared experts.
func (b *Block[T]) moeForward(w *LayerWeights[T], yTD []T, pass Pass, useCache bool) {
	rt := b.routerForward(w, pass, useCache)
	xTKD, meta := b.dispatchForward(rt, pass)
	b.st.expertOutTKD = b.expertsForward(xTKD, meta, pass)
	b.combineForward(yTD, b.st.expertOutTKD, meta, pass)
	if b.cfg.SharedExperts > 0 {
		b.sharedForward(w, yTD, pass, useCache)
	}
}

// routerForward scores the normed tokens h2 [T,D] against every expert
// and picks each token's K experts and weights (Routing). The first forward
// also keeps the expert counts and, with the aux loss on, its statistics;
// a selective recompute takes the saved top-k instead of selecting again.
func (b *Block[T]) routerForward(w *LayerWeights[T], pass Pass, useCache bool) *Routing[T] {
	c, st, ex, L := b.cfg, &b.st, b.x, b.layer
	nTok, D, E, K := b.tokens(), c.Hidden, c.Experts, c.TopK
	hTD := st.h2

	logitsTE := make([]T, nTok*E)
	linear(ex, L, OpRouter, pass, logitsTE, hTD, w.Router, nil, nTok, E, D)
	rt := newRouting[T](nTok, E, K)
	routeScores(c, rt, logitsTE)
	if idxTK, ok := st.cache[opTopKIdx]; useCache && ok {
		for i, e := range idxTK {
			rt.Indices[i] = int32(e)
		}
		st.topValTK = st.cache[OpRouterTopK]
	} else {
		routeSelect(c, rt, w.SelBias)
		st.topValTK = make([]T, nTok*K)
		for t := 0; t < nTok; t++ {
			for k, e := range rt.Indices[t*K : t*K+K] {
				st.topValTK[t*K+k] = rt.Scores[t*E+int(e)]
			}
		}
	}
	routeWeights(c, rt, st.topValTK)
	st.rt = rt
	ex.op(L, OpRouterTopK, pass, int64(nTok)*int64(E))
	if pass == Forward {
		b.counts = append([]int(nil), rt.Counts...)
	}
	if pass == Forward && b.aux {
		b.auxStats(rt)
	}
	return rt
}

// auxStats keeps, per sequence, the aux loss's statistics of the routing:
// seqCounts [B,E] (token, slot) pairs and seqScores [B,E] summed scores.
func (b *Block[T]) auxStats(rt *Routing[T]) {
	nTok, E, K := rt.Tokens, rt.Experts, rt.K
	b.seqCounts, b.seqScores = make([]int, b.batch*E), make([]T, b.batch*E)
	for t := 0; t < nTok; t++ {
		sq := t / b.seq * E
		for e, s := range rt.Scores[t*E : t*E+E] {
			b.seqScores[sq+e] += s
		}
		for _, e := range rt.Indices[t*K : t*K+K] {
			b.seqCounts[sq+int(e)]++
		}
	}
	b.x.op(b.layer, OpAuxLoss, Forward, int64(nTok)*int64(E))
}

// dispatchMeta is what dispatchForward hands on with the rows: the experts
// read the per-expert row counts, combine (and the backward pass) where
// each row came from and its weight.
type dispatchMeta[T Float] struct {
	countsE   []int   // [E] rows of each expert, e ascending (dropless: Σ = T·K)
	orderTK   []int32 // [T·K] row r holds the (token, slot) pair orderTK[r] = t·K+k
	weightsTK []T     // [T,K] routing weights
}

// rowsByToken inverts orderTK: for token t, its K dispatched rows in
// ascending row order, at [t·K, t·K+K). Combine and the dispatch's backward
// sum each token's rows in that order, the order of a serial loop over the
// rows, so splitting them by token over the cores changes no bit.
func (m dispatchMeta[T]) rowsByToken(K int) []int32 {
	rowTK := make([]int32, len(m.orderTK))
	fill := make([]int32, len(m.orderTK)/K)
	for r, tk := range m.orderTK {
		t := int(tk) / K
		rowTK[t*K+int(fill[t])] = int32(r)
		fill[t]++
	}
	return rowTK
}

// metaOf views a routing as dispatch metadata.
func metaOf[T Float](rt *Routing[T]) dispatchMeta[T] {
	return dispatchMeta[T]{countsE: rt.Counts, orderTK: rt.Order, weightsTK: rt.Weights}
}

// dispatchForward copies each token's normed row h2 once per selected
// expert into xTKD [T·K, D], in expert order.
func (b *Block[T]) dispatchForward(rt *Routing[T], pass Pass) (xTKD []T, meta dispatchMeta[T]) {
	D, K := b.cfg.Hidden, rt.K
	hTD := b.st.h2
	meta = metaOf(rt)
	rows := len(meta.orderTK)
	xTKD = make([]T, rows*D)
	kernel.ParallelFor(rows, D, func(lo, hi int) {
		for r, tk := range meta.orderTK[lo:hi] {
			t := int(tk) / K
			copy(xTKD[(lo+r)*D:(lo+r)*D+D], hTD[t*D:t*D+D])
		}
	})
	b.x.op(b.layer, OpDispatch, pass, int64(rows)*int64(D))
	return xTKD, meta
}

// expertsForward runs the routed experts on the dispatched rows (locally,
// or through Block.Experts) and returns their outputs [T·K, D], same order.
func (b *Block[T]) expertsForward(xTKD []T, meta dispatchMeta[T], pass Pass) []T {
	keep := pass == Recompute || !b.checkpointed()
	if b.Experts != nil {
		return b.Experts.ExpertsForward(b.layer, xTKD, meta.countsE, pass, keep)
	}
	return b.local.ExpertsForward(b.layer, xTKD, meta.countsE, pass, keep)
}

// combineForward adds each expert-output row, times its routing weight, to
// its token's row of yTD [T,D].
func (b *Block[T]) combineForward(yTD, expertOutTKD []T, meta dispatchMeta[T], pass Pass) {
	D, K := b.cfg.Hidden, b.cfg.TopK
	rowTK := meta.rowsByToken(K)
	kernel.ParallelFor(len(rowTK)/K, K*D, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			yD := yTD[t*D : t*D+D]
			for _, r := range rowTK[t*K : t*K+K] {
				axpy(yD, expertOutTKD[int(r)*D:int(r)*D+D], meta.weightsTK[meta.orderTK[r]])
			}
		}
	})
	b.x.round(yTD)
	b.x.op(b.layer, OpCombine, pass, int64(len(meta.orderTK))*int64(D))
}

// sharedForward adds the shared experts' output (σ-gated with SharedGated)
// to yTD [T,D].
func (b *Block[T]) sharedForward(w *LayerWeights[T], yTD []T, pass Pass, useCache bool) {
	c, st, ex, L := b.cfg, &b.st, b.x, b.layer
	nTok, D := b.tokens(), c.Hidden
	S := c.SharedExperts * c.SharedFFN
	st.ffn = newFFNActs[T](nTok, S)
	st.fOut = b.swiglu(&st.ffn, pass, useCache, OpSharedGate, OpSharedUp, OpSharedAct, OpSharedDown,
		w.SharedGate, w.SharedUp, w.SharedDown, S)
	if !c.SharedGated {
		for i, v := range st.fOut {
			yTD[i] += v
		}
		return
	}
	st.gl = b.lin(OpSharedExpGate, pass, useCache, st.h2, w.SharedExpGate, nil, nTok, 1, D)
	st.sGate = make([]T, nTok)
	for t, v := range st.gl {
		st.sGate[t] = sigmoid(v)
	}
	ex.round(st.sGate)
	for t := 0; t < nTok; t++ {
		g := st.sGate[t]
		for j := 0; j < D; j++ {
			yTD[t*D+j] += g * st.fOut[t*D+j]
		}
	}
	ex.op(L, OpSharedScale, pass, int64(nTok)*int64(D))
}

// checkpointed reports whether this block recomputes its routed experts
// in backward (the block whole, selectively, or its MoE layer).
func (b *Block[T]) checkpointed() bool {
	return b.ac.Mode == ACSelective || b.ac.FullyCheckpointed(b.layer) || b.ac.MoERecomputed(b.cfg, b.layer)
}

// Cache keys for the selective policy's non-linear saved outputs.
const (
	opLSE     Op = "attention.lse"
	opTopKIdx Op = "router_topk.indices"
)

// keep drops what the policy does not keep and records what it keeps.
func (b *Block[T]) keep() {
	st := &b.st
	switch {
	case b.ac.FullyCheckpointed(b.layer):
		*st = blockState[T]{x: st.x}
	case b.ac.Mode == ACSelective:
		cache := map[Op][]T{}
		for _, op := range selectiveSaved(b.cfg, b.layer) {
			switch op {
			case OpQProj:
				cache[op] = st.qRaw
			case OpKProj:
				cache[op] = st.kRaw
			case OpVProj:
				cache[op] = st.v
			case OpOProj:
				cache[op] = st.ao
			case OpQAProj:
				cache[op] = st.mla.qa
			case OpQBProj:
				cache[op] = st.qRaw
			case OpKVAProj:
				cache[op] = st.mla.ckv
			case OpKVBProj:
				cache[op] = st.mla.kvb
			case OpSharedGate, OpDenseGate:
				cache[op] = st.ffn.g
			case OpSharedUp, OpDenseUp:
				cache[op] = st.ffn.u
			case OpSharedDown, OpDenseDown:
				cache[op] = st.fOut
			case OpSharedExpGate:
				cache[op] = st.gl
			default:
				panic(fmt.Sprintf("moe: selective cache has no slot for %s", op))
			}
		}
		cache[OpAttn], cache[opLSE] = st.o, st.lse
		if st.rt != nil {
			idx := make([]T, len(st.rt.Indices))
			for i, e := range st.rt.Indices {
				idx[i] = T(e)
			}
			cache[OpRouterTopK], cache[opTopKIdx] = st.topValTK, idx
		}
		*st = blockState[T]{x: st.x, cache: cache}
	default:
		// none: drop what no backward formula reads
		st.ao, st.topValTK = nil, nil // the routing keeps the values when it renormalizes
		if b.cfg.QKNorm == QKNormNone {
			st.qRaw, st.kRaw = nil, nil
		}
		st.mla.ckv, st.mla.kvb = nil, nil
		if !b.cfg.SharedGated {
			st.fOut = nil
		}
		st.gl = nil
		// modules: also the recomputed norms' outputs and rstd
		// (Backward's recomputeNorm rebuilds them from the kept inputs).
		if b.ac.NormRecomputed(b.cfg, b.layer, OpAttnNorm) {
			st.h1, st.rstd1 = nil, nil
		}
		if b.ac.NormRecomputed(b.cfg, b.layer, OpFFNNorm) {
			st.h2, st.rstd2 = nil, nil
		}
		// moe: nothing of the MoE layer but its input h2 (Backward's
		// moeRecompute runs the layer again).
		if b.ac.MoERecomputed(b.cfg, b.layer) {
			st.rt, st.expertOutTKD, st.ffn, st.fOut, st.sGate = nil, nil, ffnActs[T]{}, nil, nil
		}
	}
	b.recordKept()
}

// recordKept reports every tensor the block holds for backward.
func (b *Block[T]) recordKept() {
	if b.x.rec == nil {
		return
	}
	st, L, act := &b.st, b.layer, b.x.act
	rec := func(op Op, name string, v []T, dt DType) {
		if v != nil {
			b.x.saved(L, op, name, len(v), dt)
		}
	}
	rec(OpAttnNorm, "input", st.x, act)
	if st.cache != nil {
		for _, op := range selectiveSaved(b.cfg, L) {
			rec(op, "output", st.cache[op], act)
		}
		rec(OpAttn, "output", st.cache[OpAttn], act)
		rec(OpAttn, "lse", st.cache[opLSE], F32)
		rec(OpRouterTopK, "values", st.cache[OpRouterTopK], F32)
		rec(OpRouterTopK, "indices", st.cache[opTopKIdx], I64)
		return
	}
	if !st.complete {
		return
	}
	rec(OpAttnNorm, "rstd", st.rstd1, F32)
	if b.cfg.IsMLA() {
		b.mlaRecord(rec)
	} else {
		rec(OpQProj, "input", st.h1, act)
	}
	if b.cfg.QKNorm != QKNormNone {
		rec(OpQNorm, "input", st.qRaw, act)
		rec(OpQNorm, "rstd", st.qRstd, F32)
		rec(OpKNorm, "input", st.kRaw, act)
		rec(OpKNorm, "rstd", st.kRstd, F32)
	}
	rec(OpAttn, "q", st.q, act)
	rec(OpAttn, "k", st.k, act)
	rec(OpAttn, "v", st.v, act)
	rec(OpAttn, "output", st.o, act)
	rec(OpAttn, "lse", st.lse, F32)
	rec(OpFFNNorm, "input", st.x2, act)
	rec(OpFFNNorm, "rstd", st.rstd2, F32)
	if b.cfg.MoELayer[L] {
		rec(OpRouter, "input", st.h2, act)
	} else {
		rec(OpDenseGate, "input", st.h2, act)
	}
	ops := [4]Op{OpDenseAct, OpDenseAct, OpDenseAct, OpDenseDown}
	if rt := st.rt; b.cfg.MoELayer[L] && rt != nil {
		rec(OpRouterTopK, "scores", rt.Scores, F32)
		b.x.saved(L, OpRouterTopK, "indices", len(rt.Indices), I64)
		rec(OpRouterTopK, "values", rt.Values, F32)
		rec(OpRouterTopK, "denominator", rt.Denom, F32)
		b.x.saved(L, OpDispatch, "order", len(rt.Order), I64)
		rec(OpCombine, "expert_output", st.expertOutTKD, act)
		rec(OpCombine, "weights", rt.Weights, F32)
		ops = [4]Op{OpSharedAct, OpSharedAct, OpSharedAct, OpSharedDown}
	}
	if st.ffn.g != nil {
		rec(ops[0], "gate", st.ffn.g, act)
		rec(ops[1], "silu_gate", st.ffn.sg, act)
		rec(ops[2], "up", st.ffn.u, act)
		rec(ops[3], "input", st.ffn.a, act)
	}
	if b.cfg.MoELayer[L] && b.cfg.SharedGated {
		rec(OpSharedScale, "gate", st.sGate, act)
		rec(OpSharedScale, "shared_output", st.fOut, act)
	}
}
