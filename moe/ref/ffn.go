package ref

import (
	"slices"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/kernel"
)

// SwiGLU feed-forward, y = W_down·(silu(W_gate·x) ⊙ W_up·x), over M rows:
//
//	g = x·W_gateᵀ, u = x·W_upᵀ [M,F];  σg = silu(g) = g·σ(g);  a = σg ⊙ u;  y = a·W_downᵀ [M,D]
//
// Backward: da = dy·W_down, dW_down += dyᵀ·a, dg = da ⊙ u ⊙ silu'(g) with
// silu'(g) = σ(g)·(1 + g·(1 − σ(g))), du = da ⊙ σg, dx += dg·W_gate + du·W_up,
// dW_gate += dgᵀ·x, dW_up += duᵀ·x.
//
// What backward reads is what PyTorch autograd keeps for
// F.silu(x@W_gateᵀ) * (x@W_upᵀ) @ W_downᵀ (torch 1.13 saved_tensors_hooks):
// mm keeps its input, silu its input g, mul both factors σg and u, and the
// last mm its input a. routed experts run the same maths per expert on the
// rows dispatched to it (a grouped GEMM; torch._grouped_mm keeps its inputs
// too, derivatives.yaml).

// ffnActs holds the SwiGLU intermediates of M rows.
type ffnActs[T Float] struct {
	g, sg, u, a []T // [M,F]
}

func newFFNActs[T Float](m, f int, buf func(int) []T) ffnActs[T] {
	return ffnActs[T]{g: buf(m * f), sg: buf(m * f), u: buf(m * f), a: buf(m * f)}
}

// swigluAct computes σg = silu(g) and a = σg ⊙ u. float32 runs
// kernel.SwiGLU (every core, AVX2 vectors; σ within a few ulp of this
// loop's, tested there).
func swigluAct[T Float](s ffnActs[T]) {
	if g32, ok := any(s.g).([]float32); ok {
		kernel.SwiGLU(any(s.sg).([]float32), any(s.a).([]float32), g32, any(s.u).([]float32))
		return
	}
	for i, g := range s.g {
		s.sg[i] = g * sigmoid(g)
		s.a[i] = s.sg[i] * s.u[i]
	}
}

// swigluActBwd writes dg and du from da; float32 runs
// kernel.SwiGLUBackward.
func swigluActBwd[T Float](dg, du, da []T, s ffnActs[T]) {
	if g32, ok := any(s.g).([]float32); ok {
		kernel.SwiGLUBackward(any(dg).([]float32), any(du).([]float32), any(da).([]float32), g32,
			any(s.sg).([]float32), any(s.u).([]float32))
		return
	}
	for i, g := range s.g {
		sig := sigmoid(g)
		d := da[i]
		du[i] = d * s.sg[i]
		dg[i] = d * s.u[i] * sig * (1 + g*(1-sig))
	}
}

// localExperts runs every routed expert of a layer on this machine: one
// SwiGLU per expert over its rows, counted as grouped GEMMs.
type localExperts[T Float] struct {
	b      *Block[T]
	w, g   *LayerWeights[T] // weights and gradients of the current call
	xTKD   []T              // kept input rows [T·K, D]
	acts   ffnActs[T]       // kept intermediates [T·K, F]
	counts []int
}

// buf is the block's scratch (Block.buf) for the block's own local
// experts, whose kept buffers retainKept sees in Block.local; a copy run
// inside an ExpertStage keeps them where the block cannot see, so makes them.
func (l *localExperts[T]) buf(n int) []T {
	if l != &l.b.local {
		return make([]T, n)
	}
	return l.b.buf(n)
}

// Grouped GEMMs over rows in expert order (offsets[e]..offsets[e+1] are
// expert e's rows): float32 through moe/kernel's grouped kernels, float64
// through the plain linear loops.

// nonEmpty drops the experts without rows (an expert-parallel rank leaves
// the weights of experts it does not hold nil; they never have rows here).
func nonEmpty[T Float](w [][]T, off []int) ([][]T, []int) {
	ws, o := make([][]T, 0, len(w)), make([]int, 1, len(off))
	for e := range w {
		if off[e+1] > off[e] {
			ws = append(ws, w[e])
			o = append(o, off[e+1])
		}
	}
	return ws, o
}

func groupedFwd[T Float](y, x []T, w [][]T, off []int, n, k int) {
	w, off = nonEmpty(w, off)
	if y32, ok := any(y).([]float32); ok {
		kernel.GroupedLinear(y32, any(x).([]float32), any(w).([][]float32), off, n, k)
		return
	}
	for e := range w {
		if r := off[e+1] - off[e]; r > 0 {
			linearFwd(y[off[e]*n:off[e+1]*n], x[off[e]*k:off[e+1]*k], w[e], r, n, k)
		}
	}
}

func groupedBwdX[T Float](dx, dy []T, w [][]T, off []int, n, k int) {
	w, off = nonEmpty(w, off)
	if dx32, ok := any(dx).([]float32); ok {
		kernel.GroupedLinearBackwardData(dx32, any(dy).([]float32), any(w).([][]float32), off, n, k)
		return
	}
	for e := range w {
		if r := off[e+1] - off[e]; r > 0 {
			linearBwdX(dx[off[e]*k:off[e+1]*k], dy[off[e]*n:off[e+1]*n], w[e], r, n, k)
		}
	}
}

func groupedBwdW[T Float](dw [][]T, dy, x []T, off []int, n, k int) {
	dw, off = nonEmpty(dw, off)
	if dy32, ok := any(dy).([]float32); ok {
		kernel.GroupedLinearBackwardWeight(any(dw).([][]float32), dy32, any(x).([]float32), off, n, k)
		return
	}
	for e := range dw {
		if r := off[e+1] - off[e]; r > 0 {
			linearBwdW(dw[e], dy[off[e]*n:off[e+1]*n], x[off[e]*k:off[e+1]*k], r, n, k)
		}
	}
}

// offsets turns per-expert counts into row offsets (len E+1).
func offsets(counts []int) []int {
	off := make([]int, len(counts)+1)
	for e, n := range counts {
		off[e+1] = off[e] + n
	}
	return off
}

// ExpertsForward implements ExpertStage.
func (l *localExperts[T]) ExpertsForward(layer int, xTKD []T, counts []int, pass moe.Pass, keep bool) []T {
	c, ex := l.b.cfg, l.b.x
	D, F := c.Hidden, c.ExpertFFN
	ew := expertWeights(c, l.w)
	wGateEFD, wUpEFD, wDownEDF := ew.gate, ew.up, ew.down
	rows := len(xTKD) / D
	s := newFFNActs(rows, F, l.buf)
	yTKD := l.buf(rows * D)
	off := offsets(counts)
	q := ex.q
	qx, _, qGate := quantGrouped(q, moe.OpExpertGate, layer, gemmForward, xTKD, nil, wGateEFD, off, F, D)
	_, _, qUp := quantGrouped(q, moe.OpExpertUp, layer, gemmForward, xTKD, nil, wUpEFD, off, F, D)
	groupedFwd(s.g, qx, qGate, off, F, D)
	groupedFwd(s.u, qx, qUp, off, F, D)
	addGroupBias(s.g, ew.gateB, off, F)
	addGroupBias(s.u, ew.upB, off, F)
	ex.round(s.g)
	ex.round(s.u)
	expertAct(c, s)
	ex.round(s.sg)
	ex.round(s.a)
	qa, _, qDown := quantGrouped(q, moe.OpExpertDown, layer, gemmForward, s.a, nil, wDownEDF, off, D, F)
	groupedFwd(yTKD, qa, qDown, off, D, F)
	addGroupBias(yTKD, ew.downB, off, D)
	ex.round(yTKD)
	rfd := int64(rows) * int64(F) * int64(D)
	ex.op(layer, moe.OpExpertGate, pass, rfd)
	ex.op(layer, moe.OpExpertUp, pass, rfd)
	ex.op(layer, moe.OpExpertAct, pass, int64(rows)*int64(F))
	ex.op(layer, moe.OpExpertDown, pass, rfd)
	l.xTKD, l.acts, l.counts = nil, ffnActs[T]{}, nil
	if keep {
		if l.b.ac.ActRecomputed(c, layer) {
			// moe_act: only the activation's inputs are kept;
			// ExpertsBackward recomputes σg and a.
			s.sg, s.a = nil, nil
		}
		l.xTKD, l.acts, l.counts = xTKD, s, counts
		if pass == moe.Forward {
			ex.saved(layer, moe.OpExpertGate, moe.SavedInput, len(xTKD), ex.act)
			ex.saved(layer, moe.OpExpertAct, moe.SavedGate, len(s.g), ex.act)
			if s.sg != nil {
				ex.saved(layer, moe.OpExpertAct, moe.SavedSiLUGate, len(s.sg), ex.act)
			}
			ex.saved(layer, moe.OpExpertAct, moe.SavedUp, len(s.u), ex.act)
			if s.a != nil {
				ex.saved(layer, moe.OpExpertDown, moe.SavedInput, len(s.a), ex.act)
			}
		}
	}
	return yTKD
}

// ExpertsBackward implements ExpertStage.
func (l *localExperts[T]) ExpertsBackward(layer int, dyTKD []T) []T {
	c, ex := l.b.cfg, l.b.x
	D, F := c.Hidden, c.ExpertFFN
	ew := expertWeights(c, l.w)
	wGateEFD, wUpEFD, wDownEDF := ew.gate, ew.up, ew.down
	eg, fold := expertGrads(c, l.g)
	rows := len(dyTKD) / D
	off := offsets(l.counts)
	if l.acts.a == nil {
		// moe_act: the activation again from the kept gate and up, before
		// the down projection's backward reads its input (Megatron's hook
		// on linear_fc2's output gradient).
		l.acts.sg, l.acts.a = l.buf(rows*F), l.buf(rows*F)
		expertAct(c, l.acts)
		ex.round(l.acts.sg)
		ex.round(l.acts.a)
		ex.op(layer, moe.OpExpertAct, moe.Recompute, int64(rows)*int64(F))
	}
	da := l.buf(rows * F)
	dg, du := l.buf(rows*F), l.buf(rows*F)
	dxTKD := l.buf(rows * D)
	q := ex.q
	qdy, _, qDown := quantGrouped(q, moe.OpExpertDown, layer, gemmDataGrad, dyTKD, nil, wDownEDF, off, D, F)
	groupedBwdX(da, qdy, qDown, off, D, F)
	gDown, gGate, gUp, aIn, xIn, dyW := eg.down, eg.gate, eg.up, l.acts.a, l.xTKD, dyTKD
	if ex.wq != nil { // the caller may reuse dy before the queue runs
		dyW = slices.Clone(dyTKD)
	}
	ex.weightPass(func() {
		qdy, qa, _ := quantGrouped(q, moe.OpExpertDown, layer, gemmWeightGrad, dyW, aIn, nil, off, D, F)
		groupedBwdW(gDown, qdy, qa, off, D, F)
		groupBiasGrad(eg.downB, dyW, off, D)
	})
	expertActBwd(c, dg, du, da, l.acts)
	qdg, _, qGate := quantGrouped(q, moe.OpExpertGate, layer, gemmDataGrad, dg, nil, wGateEFD, off, F, D)
	qdu, _, qUp := quantGrouped(q, moe.OpExpertUp, layer, gemmDataGrad, du, nil, wUpEFD, off, F, D)
	groupedBwdX(dxTKD, qdg, qGate, off, F, D)
	groupedBwdX(dxTKD, qdu, qUp, off, F, D)
	ex.weightPass(func() {
		qdg, qx, _ := quantGrouped(q, moe.OpExpertGate, layer, gemmWeightGrad, dg, xIn, nil, off, F, D)
		qdu, qx2, _ := quantGrouped(q, moe.OpExpertUp, layer, gemmWeightGrad, du, xIn, nil, off, F, D)
		groupedBwdW(gGate, qdg, qx, off, F, D)
		groupedBwdW(gUp, qdu, qx2, off, F, D)
		groupBiasGrad(eg.gateB, dg, off, F)
		groupBiasGrad(eg.upB, du, off, F)
		fold()
	})
	rfd := int64(rows) * int64(F) * int64(D)
	for _, op := range []moe.Op{moe.OpExpertDown, moe.OpExpertGate, moe.OpExpertUp} {
		ex.op(layer, op, moe.BackwardData, rfd)
		ex.op(layer, op, moe.BackwardWeight, rfd)
	}
	ex.op(layer, moe.OpExpertAct, moe.BackwardData, int64(rows)*int64(F))
	l.xTKD, l.acts, l.counts = nil, ffnActs[T]{}, nil
	return dxTKD
}
