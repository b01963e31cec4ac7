package ref

import (
	"github.com/moescope/moescope/moe"
	"math"
)

// Cache keys of the selective policy's reduce-scatter outputs under
// sequence parallelism: torchtitan v0.2.2's _op_sac_save_list
// (models/qwen3/infra/parallelize.py) saves
// torch.ops._c10d_functional.reduce_scatter_tensor outputs, so a selective
// recompute does not re-run the two reduce-scatters (it does re-run the
// all-gathers, which the list does not name).
const (
	opTPAttnScatter = moe.Op(string(moe.OpOProj) + "." + string(moe.SavedTPReduceScatterOutput))
	opTPFFNScatter  = moe.Op("ffn." + string(moe.SavedTPReduceScatterOutput))
)

// ForwardSP runs the block as one rank of a tensor-parallel group with
// sequence parallelism: xLocal [T/tp, D] is the rank's tokens of the block
// input (T = batch·seq of the data-parallel rank, which the group shares),
// the block was built from TPLocal and w holds the rank's pieces of
// the weights (TPShard). It returns the rank's tokens of the output and
// keeps what the policy says, with the reduce-scatter outputs under the
// selective policy. ExpertCounts then counts the routed rows this rank
// dispatched (TPComm.ExpertTokens' tokens).
func (b *Block[T]) ForwardSP(w *LayerWeights[T], xLocal []T, tc TPComm[T]) []T {
	if len(xLocal) == 0 || len(xLocal)%b.cfg.Hidden != 0 || b.tokens()*b.cfg.Hidden%len(xLocal) != 0 {
		panic("moe: Block.ForwardSP needs the rank's share of batch·seq tokens of hidden elements")
	}
	b.scratch.Release()
	b.st = blockState[T]{x: xLocal}
	b.local.w = w
	out, aoL, yL := b.forwardSP(w, moe.Forward, false, tc)
	b.keep()
	if b.st.cache != nil {
		b.st.cache[opTPAttnScatter], b.st.cache[opTPFFNScatter] = aoL, yL
		ffn := moe.OpDenseDown
		if b.cfg.MoELayer[b.layer] {
			ffn = moe.OpCombine
		}
		b.x.saved(b.layer, moe.OpOProj, moe.SavedTPReduceScatterOutput, len(aoL), b.x.act)
		b.x.saved(b.layer, ffn, moe.SavedTPReduceScatterOutput, len(yL), b.x.act)
	}
	b.retainKept()
	return out
}

// forwardSP is forward with the norms and residuals on the local tokens and
// the attention and FFN on all of them; it also returns the two
// reduce-scatter outputs (the attention's and the FFN's, local tokens),
// taken from the selective cache when useCache finds them there.
func (b *Block[T]) forwardSP(w *LayerWeights[T], pass moe.Pass, useCache bool, tc TPComm[T]) (out, aoL, yL []T) {
	c, st, ex, L := b.cfg, &b.st, b.x, b.layer
	T_, D, H := b.tokens(), c.Hidden, c.Heads
	tl := len(st.x) / D

	st.h1, st.rstd1 = b.normGather(moe.OpAttnNorm, pass, st.x, w.AttnNorm, tc)
	b.qkvForward(w, pass, useCache)
	b.attend(w, pass, useCache)
	st.ao = b.lin(moe.OpOProj, pass, useCache, st.o, w.Wo, nil, T_, D, H*c.VHeadDim()) // partial sums
	aoL, ok := st.cache[opTPAttnScatter]
	if !useCache || !ok {
		aoL = tc.Scatter(L, pass, st.ao)
	}

	st.x2 = b.buf(tl * D)
	addInto(st.x2, st.x, aoL)
	ex.round(st.x2)
	st.h2, st.rstd2 = b.normGather(moe.OpFFNNorm, pass, st.x2, w.FFNNorm, tc)

	y := b.buf(T_ * D) // partial sums of the row-parallel outputs
	if c.MoELayer[L] {
		lo, hi := tc.ExpertTokens(T_)
		b.moeForwardRows(w, y, pass, useCache, lo, hi)
	} else {
		st.ffn = newFFNActs(T_, c.DenseFFN, b.buf)
		st.fOut = b.swiglu(&st.ffn, pass, useCache, moe.OpDenseGate, moe.OpDenseUp, moe.OpDenseAct, moe.OpDenseDown,
			w.DenseGate, w.DenseUp, w.DenseDown, c.DenseFFN)
		copy(y, st.fOut)
	}
	yL, ok = st.cache[opTPFFNScatter]
	if !useCache || !ok {
		yL = tc.Scatter(L, pass, y)
	}
	out = b.outBuf(pass, tl*D)
	addInto(out, st.x2, yL)
	ex.round(out)
	ex.op(L, moe.OpResidual, pass, 2*int64(tl)*int64(D))
	st.complete = true
	return out, aoL, yL
}

// normGather is a sequence-parallel RMSNorm (op) of the rank's local
// tokens xl with weight nw, recorded at their count, and the all-gather
// that brings every token of the normed input to the column-parallel
// linears after it; it returns the gathered output and the local rstd.
func (b *Block[T]) normGather(op moe.Op, pass moe.Pass, xl, nw []T, tc TPComm[T]) (h, rstd []T) {
	D := b.cfg.Hidden
	tl := len(xl) / D
	hl, rstd := b.buf(tl*D), b.buf(tl)
	rmsNormFwd(hl, rstd, xl, nw, D, b.cfg.NormEps)
	b.x.round(hl)
	b.x.op(b.layer, op, pass, int64(tl)*int64(D))
	return tc.Gather(b.layer, pass, hl), rstd
}

// BackwardSP is Backward for a block run by ForwardSP: dyLocal [T/tp, D]
// is the gradient of the rank's output tokens. The weight gradients of the
// rank's pieces are complete; those of the replicated tensors (norms, the
// router, the shared-expert gate) are this rank's partial sums, which the
// caller sums over the group. auxGrad, when set, must be given on one
// member only (every member routes the same tokens).
func (b *Block[T]) BackwardSP(w, g *LayerWeights[T], dyLocal, auxGrad []T, tc TPComm[T]) []T {
	c, ex, L := b.cfg, b.x, b.layer
	if b.st.x == nil || len(dyLocal) != len(b.st.x) {
		panic("moe: Block.BackwardSP needs a preceding ForwardSP and dy of its input's size")
	}
	if !b.st.complete {
		b.local.w = w
		b.forwardSP(w, moe.Recompute, b.st.cache != nil, tc)
	}
	b.local.w, b.local.g = w, g
	st := &b.st
	T_, D := b.tokens(), c.Hidden
	tl := int64(len(dyLocal) / D)

	dy := tc.Gather(L, moe.BackwardData, dyLocal)
	if st.h2 == nil {
		// modules: layernorm (MoE blocks; MLA, whose input norm it also
		// recomputes, is refused under tp): the sequence-parallel norm and
		// its all-gather again, before the FFN's backward reads h2.
		st.h2, st.rstd2 = b.normGather(moe.OpFFNNorm, moe.Recompute, st.x2, w.FFNNorm, tc)
	}
	dh2 := b.buf(T_ * D)
	if c.MoELayer[L] {
		lo, hi := tc.ExpertTokens(T_)
		if st.rt == nil {
			// modules: moe, the MoE layer again from its kept input (the
			// gathered norm output, or the one just re-gathered), after
			// the norm's recompute as in Megatron.
			b.moeForwardRows(w, b.buf(T_*D), moe.Recompute, false, lo, hi)
		}
		b.moeBackwardRows(w, g, dh2, dy, auxGrad, lo, hi)
		tc.ExpertsDone(L)
	} else {
		b.swigluBack(&st.ffn, moe.OpDenseGate, moe.OpDenseUp, moe.OpDenseAct, moe.OpDenseDown,
			w.DenseGate, w.DenseUp, w.DenseDown, g.DenseGate, g.DenseUp, g.DenseDown, c.DenseFFN, dh2, dy)
	}
	dx2 := append([]T(nil), dyLocal...)
	rmsNormBwd(dx2, g.FFNNorm, tc.Scatter(L, moe.BackwardData, dh2), st.x2, st.rstd2, w.FFNNorm, D)
	ex.op(L, moe.OpFFNNorm, moe.BackwardData, tl*int64(D))
	ex.op(L, moe.OpFFNNorm, moe.BackwardWeight, tl*int64(D))

	dh1 := b.attentionBackward(w, g, tc.Gather(L, moe.BackwardData, dx2))
	dx := dx2
	rmsNormBwd(dx, g.AttnNorm, tc.Scatter(L, moe.BackwardData, dh1), st.x, st.rstd1, w.AttnNorm, D)
	ex.op(L, moe.OpAttnNorm, moe.BackwardData, tl*int64(D))
	ex.op(L, moe.OpAttnNorm, moe.BackwardWeight, tl*int64(D))
	b.st = blockState[T]{}
	b.scratch.Release()
	return dx
}

// ForwardShard is the embedding of a tp rank holding the vocabulary rows
// [lo, lo+len(table)/D) (RowwiseParallel on nn.Embedding): x_t =
// table[ids_t − lo] for the ids it holds, zero for the others, the partial
// output a reduce-scatter sums into the sequence-parallel region.
func (e *Embedding[T]) ForwardShard(table []T, ids []int, lo int) []T {
	D := e.cfg.Hidden
	rows := len(table) / D
	x := make([]T, len(ids)*D)
	for t, id := range ids {
		if r := id - lo; r >= 0 && r < rows {
			copy(x[t*D:t*D+D], table[r*D:r*D+D])
		}
	}
	e.ids = ids
	e.x.op(moe.LayerEmbed, moe.OpEmbed, moe.Forward, int64(len(ids))*int64(D))
	e.x.saved(moe.LayerEmbed, moe.OpEmbed, moe.SavedIDs, len(ids), moe.I64)
	return x
}

// BackwardShard accumulates gTable[ids_t − lo] += dx_t for the ids the
// rank holds; dx [T,D] is the gradient of all tokens.
func (e *Embedding[T]) BackwardShard(gTable, dx []T, lo int) {
	D := e.cfg.Hidden
	rows := len(gTable) / D
	for t, id := range e.ids {
		r := id - lo
		if r < 0 || r >= rows {
			continue
		}
		ge := gTable[r*D : r*D+D]
		for j, v := range dx[t*D : t*D+D] {
			ge[j] += v
		}
	}
	e.x.op(moe.LayerEmbed, moe.OpEmbed, moe.BackwardWeight, int64(len(e.ids))*int64(D))
	e.ids = nil
}

// headCols is the tp rank's real vocabulary columns [lo, lo+n) of an LM
// head piece of vl padded rows; vocab is the whole vocabulary.
func headCols(lo, vl, vocab int) int { return max(0, min(lo+vl, vocab)-lo) }

// ForwardTP is Forward for a tp rank: the final norm on its local tokens
// xLocal [T/tp, D], an all-gather into the column-parallel LM head, whose
// piece holds the vocabulary rows [lo, lo+⌈V/tp⌉) (past vocab: padding),
// and loss parallel (PyTorch torch/distributed/tensor/parallel/loss.py:
// _log_softmax and _nll_loss_forward on vocabulary-sharded logits): three
// all-reduces over T per micro-batch, the maximum logit, the sum of
// exponentials and the target's log-probability. labels [T] are all the
// group's tokens.
func (h *Head[T]) ForwardTP(w *GlobalWeights[T], xLocal []T, labels []int, lo, vocab int, tc TPComm[T]) float64 {
	c, ex, L := h.cfg, h.x, h.cfg.LayerHead()
	T_, D := len(labels), c.Hidden
	vl := len(w.LMHead) / D
	n := headCols(lo, vl, vocab)
	tl := len(xLocal) / D
	h.in, h.labels = xLocal, labels
	hl, rstd := make([]T, tl*D), make([]T, tl)
	rmsNormFwd(hl, rstd, xLocal, w.FinalNorm, D, c.NormEps)
	ex.round(hl)
	ex.op(L, moe.OpFinalNorm, moe.Forward, int64(tl)*int64(D))
	h.rstd = rstd
	h.hf = tc.Gather(L, moe.Forward, hl)
	h.logp = make([]T, T_*vl)
	linear(ex, L, moe.OpLMHead, moe.Forward, h.logp, h.hf, w.LMHead, nil, T_, vl, D)
	mx, s, tgt := make([]T, T_), make([]T, T_), make([]T, T_)
	for t := range mx {
		mx[t] = T(math.Inf(-1))
		for _, v := range h.logp[t*vl : t*vl+n] {
			mx[t] = max(mx[t], v)
		}
	}
	tc.AllReduce(L, mx, true)
	for t := range s {
		var sum float64
		for _, v := range h.logp[t*vl : t*vl+n] {
			sum += math.Exp(float64(v - mx[t]))
		}
		s[t] = T(sum)
	}
	tc.AllReduce(L, s, false)
	for t, y := range labels {
		z := h.logp[t*vl : t*vl+vl]
		lse := T(float64(mx[t]) + math.Log(float64(s[t])))
		for i := range z[:n] {
			z[i] -= lse
		}
		clear(z[n:]) // padding rows of the piece: no vocabulary entry
		if r := y - lo; r >= 0 && r < n {
			tgt[t] = z[r]
		}
	}
	tc.AllReduce(L, tgt, false)
	var loss float64
	for _, v := range tgt {
		loss -= float64(v)
	}
	ex.op(L, moe.OpLoss, moe.Forward, int64(T_)*int64(vl))
	ex.saved(L, moe.OpFinalNorm, moe.SavedInput, len(xLocal), ex.act)
	ex.saved(L, moe.OpFinalNorm, moe.SavedRstd, len(h.rstd), moe.F32)
	ex.saved(L, moe.OpLMHead, moe.SavedInput, len(h.hf), ex.act)
	ex.saved(L, moe.OpLoss, moe.SavedLogProbs, len(h.logp), moe.F32)
	ex.saved(L, moe.OpLoss, moe.SavedLabels, T_, moe.I64)
	return loss / float64(T_)
}

// BackwardTP is Backward after ForwardTP: the local logits' gradient
// scale·(softmax − onehot)/T needs no collective (loss parallel); the LM
// head's input gradient is a partial sum over [T, D] that a reduce-scatter
// returns to the sequence-parallel region. The final norm's weight gradient
// is this rank's partial sum. It returns the gradient of xLocal.
func (h *Head[T]) BackwardTP(w, g *GlobalWeights[T], scale float64, lo, vocab int, tc TPComm[T]) []T {
	c, ex, L := h.cfg, h.x, h.cfg.LayerHead()
	T_, D := len(h.labels), c.Hidden
	vl := len(w.LMHead) / D
	n := headCols(lo, vl, vocab)
	tl := int64(len(h.in) / D)
	k := T(scale / float64(T_))
	dlogits := make([]T, T_*vl)
	for t, y := range h.labels {
		lp, d := h.logp[t*vl:t*vl+n], dlogits[t*vl:t*vl+n]
		for i, v := range lp {
			d[i] = k * exp(v)
		}
		if r := y - lo; r >= 0 && r < n {
			d[r] -= k
		}
	}
	ex.op(L, moe.OpLoss, moe.BackwardData, int64(T_)*int64(vl))
	dhf := make([]T, T_*D)
	linearBack(ex, L, moe.OpLMHead, dhf, g.LMHead, nil, dlogits, h.hf, w.LMHead, T_, vl, D)
	dx := make([]T, len(h.in))
	rmsNormBwd(dx, g.FinalNorm, tc.Scatter(L, moe.BackwardData, dhf), h.in, h.rstd, w.FinalNorm, D)
	ex.op(L, moe.OpFinalNorm, moe.BackwardData, tl*int64(D))
	ex.op(L, moe.OpFinalNorm, moe.BackwardWeight, tl*int64(D))
	*h = Head[T]{cfg: h.cfg, x: h.x}
	return dx
}

// moeForwardRows is moeForward dispatching only the routed rows of tokens
// [lo, hi) (the router scores every token, as every member does): their
// combined outputs land in those tokens' rows of yTD [T,D], the other rows
// stay zero for the reduce-scatter to fill from the other members.
func (b *Block[T]) moeForwardRows(w *LayerWeights[T], yTD []T, pass moe.Pass, useCache bool, lo, hi int) {
	if lo == 0 && hi == b.tokens() {
		b.moeForward(w, yTD, pass, useCache)
		return
	}
	D := b.cfg.Hidden
	rt := b.routerForward(w, pass, useCache)
	meta := rowsMeta(rt, lo, hi)
	if pass == moe.Forward {
		b.counts = meta.countsE // ExpertCounts: the rows this rank dispatched
	}
	xTKD := b.stageBuf(len(meta.orderTK) * D)
	hTD := b.st.h2[lo*D : hi*D]
	for r, tk := range meta.orderTK {
		t, row := int(tk)/rt.K, xTKD[r*D:r*D+D]
		copy(row, hTD[t*D:t*D+D])
		if b.cfg.RouteInput { // as dispatchForward
			for j := range row {
				row[j] *= meta.weightsTK[tk]
			}
		}
	}
	b.x.op(b.layer, moe.OpDispatch, pass, int64(len(meta.orderTK))*int64(D))
	b.st.expertOutTKD = b.expertsForward(xTKD, meta, pass)
	b.combineForward(yTD[lo*D:hi*D], b.st.expertOutTKD, meta, pass)
	if b.cfg.SharedExperts > 0 {
		b.sharedForward(w, yTD, pass, useCache)
	}
}

// moeBackwardRows is moeBackward after moeForwardRows: the routing
// weights' gradient is non-zero for tokens [lo, hi) only (a partial sum
// over the group, like the rest of dhTD's).
func (b *Block[T]) moeBackwardRows(w, g *LayerWeights[T], dhTD, dyTD, auxGrad []T, lo, hi int) {
	if lo == 0 && hi == b.tokens() {
		b.moeBackward(w, g, dhTD, dyTD, auxGrad)
		return
	}
	D, K := b.cfg.Hidden, b.cfg.TopK
	if b.cfg.SharedExperts > 0 {
		b.sharedBackward(w, g, dhTD, dyTD)
	}
	meta := rowsMeta(b.st.rt, lo, hi)
	dExpertOutTKD, dWeightsLocal := b.combineBackward(dyTD[lo*D:hi*D], meta)
	dxTKD := b.expertsBackward(dExpertOutTKD)
	b.dispatchBackward(dhTD[lo*D:hi*D], b.st.h2[lo*D:hi*D], dxTKD, dWeightsLocal, meta)
	dWeightsTK := b.buf(b.tokens() * K)
	copy(dWeightsTK[lo*K:hi*K], dWeightsLocal)
	b.routerBackward(w, g, dhTD, dWeightsTK, auxGrad)
}

// rowsMeta is the dispatch metadata of the routed rows of tokens [lo, hi),
// in the routing's expert order, with (token, slot) indices relative to lo.
func rowsMeta[T Float](rt *Routing[T], lo, hi int) dispatchMeta[T] {
	K := rt.K
	m := dispatchMeta[T]{countsE: make([]int, rt.Experts), weightsTK: rt.Weights[lo*K : hi*K]}
	for _, tk := range rt.Order {
		if t := int(tk) / K; t >= lo && t < hi {
			m.orderTK = append(m.orderTK, tk-int32(lo*K))
			m.countsE[rt.Indices[tk]]++
		}
	}
	return m
}
