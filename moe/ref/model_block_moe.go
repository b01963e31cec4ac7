package ref

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/kernel"
)

// The MoE layer of a block, forward: router → dispatch → experts → combine,
// then the shared experts (model_block_bwd.go runs them backward).

// moeForward adds the MoE layer's output to yTD [T,D]: the routed experts
// as router → dispatch → experts → combine, then the shared experts.
func (b *Block[T]) moeForward(w *LayerWeights[T], yTD []T, pass moe.Pass, useCache bool) {
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
func (b *Block[T]) routerForward(w *LayerWeights[T], pass moe.Pass, useCache bool) *Routing[T] {
	c, st, ex, L := b.cfg, &b.st, b.x, b.layer
	nTok, D, E, K := b.tokens(), c.Hidden, c.Experts, c.TopK
	hTD := st.h2

	logitsTE := b.buf(nTok * E)
	linear(ex, L, moe.OpRouter, pass, logitsTE, hTD, w.Router, w.RouterBias, nTok, E, D)
	rt := newRouting[T](nTok, E, K)
	routeScores(c, rt, logitsTE)
	if idxTK, ok := st.cache[opTopKIdx]; useCache && ok {
		for i, e := range idxTK {
			rt.Indices[i] = int32(e)
		}
		st.topValTK = st.cache[moe.OpRouterTopK]
	} else {
		routeSelect(c, rt, w.SelBias)
		st.topValTK = make([]T, nTok*K) // the routing may keep it (Routing.Values): not scratch
		for t := 0; t < nTok; t++ {
			for k, e := range rt.Indices[t*K : t*K+K] {
				st.topValTK[t*K+k] = rt.Scores[t*E+int(e)]
			}
		}
	}
	routeWeights(c, rt, st.topValTK)
	st.rt = rt
	ex.op(L, moe.OpRouterTopK, pass, int64(nTok)*int64(E))
	if pass == moe.Forward {
		b.counts = append([]int(nil), rt.Counts...)
	}
	if pass == moe.Forward && b.aux {
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
	b.x.op(b.layer, moe.OpAuxLoss, moe.Forward, int64(nTok)*int64(E))
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

// outWeight is the weight combine multiplies row r's output by: its routing
// weight, or 1 when the weight scaled the row's input (Config.RouteInput).
func (m dispatchMeta[T]) outWeight(c *moe.Config, r int32) T {
	if c.RouteInput {
		return 1
	}
	return m.weightsTK[m.orderTK[r]]
}

// metaOf views a routing as dispatch metadata.
func metaOf[T Float](rt *Routing[T]) dispatchMeta[T] {
	return dispatchMeta[T]{countsE: rt.Counts, orderTK: rt.Order, weightsTK: rt.Weights}
}

// dispatchForward copies each token's normed row h2 once per selected
// expert into xTKD [T·K, D], in expert order; with Config.RouteInput times
// the row's routing weight (Llama4TextMoe's routed_in = x·score).
func (b *Block[T]) dispatchForward(rt *Routing[T], pass moe.Pass) (xTKD []T, meta dispatchMeta[T]) {
	D, K := b.cfg.Hidden, rt.K
	hTD := b.st.h2
	meta = metaOf(rt)
	rows := len(meta.orderTK)
	xTKD = b.stageBuf(rows * D)
	kernel.ParallelFor(rows, D, func(lo, hi int) {
		for r, tk := range meta.orderTK[lo:hi] {
			t, row := int(tk)/K, xTKD[(lo+r)*D:(lo+r)*D+D]
			copy(row, hTD[t*D:t*D+D])
			if b.cfg.RouteInput { // Llama 4: the weight scales the expert's input
				for j := range row {
					row[j] *= meta.weightsTK[tk]
				}
			}
		}
	})
	b.x.op(b.layer, moe.OpDispatch, pass, int64(rows)*int64(D))
	return xTKD, meta
}

// expertsForward runs the routed experts on the dispatched rows (locally,
// or through Block.Experts) and returns their outputs [T·K, D], same order.
func (b *Block[T]) expertsForward(xTKD []T, meta dispatchMeta[T], pass moe.Pass) []T {
	keep := pass == moe.Recompute || !b.checkpointed()
	if b.Experts != nil {
		return b.Experts.ExpertsForward(b.layer, xTKD, meta.countsE, pass, keep)
	}
	return b.local.ExpertsForward(b.layer, xTKD, meta.countsE, pass, keep)
}

// combineForward adds each expert-output row, times its routing weight
// (1 under RouteInput: the input carried it), to its token's row of yTD [T,D].
func (b *Block[T]) combineForward(yTD, expertOutTKD []T, meta dispatchMeta[T], pass moe.Pass) {
	D, K := b.cfg.Hidden, b.cfg.TopK
	rowTK := meta.rowsByToken(K)
	kernel.ParallelFor(len(rowTK)/K, K*D, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			yD := yTD[t*D : t*D+D]
			for _, r := range rowTK[t*K : t*K+K] {
				axpy(yD, expertOutTKD[int(r)*D:int(r)*D+D], meta.outWeight(b.cfg, r))
			}
		}
	})
	b.x.round(yTD)
	b.x.op(b.layer, moe.OpCombine, pass, int64(len(meta.orderTK))*int64(D))
}

// sharedForward adds the shared experts' output (σ-gated with SharedGated)
// to yTD [T,D].
func (b *Block[T]) sharedForward(w *LayerWeights[T], yTD []T, pass moe.Pass, useCache bool) {
	c, st, ex, L := b.cfg, &b.st, b.x, b.layer
	nTok, D := b.tokens(), c.Hidden
	S := c.SharedExperts * c.SharedFFN
	st.ffn = newFFNActs(nTok, S, b.buf)
	st.fOut = b.swiglu(&st.ffn, pass, useCache, moe.OpSharedGate, moe.OpSharedUp, moe.OpSharedAct, moe.OpSharedDown,
		w.SharedGate, w.SharedUp, w.SharedDown, S)
	if !c.SharedGated {
		for i, v := range st.fOut {
			yTD[i] += v
		}
		return
	}
	st.gl = b.lin(moe.OpSharedExpGate, pass, useCache, st.h2, w.SharedExpGate, nil, nTok, 1, D)
	st.sGate = b.buf(nTok)
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
	ex.op(L, moe.OpSharedScale, pass, int64(nTok)*int64(D))
}
