package ref

import "github.com/moescope/moescope/moe"

// GPT-OSS's routed experts (GptOssExperts in modeling_gpt_oss.py,
// transformers 00d4b3d2): biased gate, up and down projections under the
// clamped SwiGLU (moe/swiglu.go), stored fused (moe/fused.go):
//
//	h = x·W_gu + b_gu  (W_gu [D, 2F]),  gate = h[..., 0::2], up = h[..., 1::2]
//	y = act(gate, up)·W_d + b_d  (W_d [F, D]),  then y times the routing weight
//
// The local experts run them as the other model types' experts: per expert
// gate [F, D], up [F, D] and down [D, F] in linear's [out, in] layout,
// de-interleaved and transposed from the fused tensors for each call, and
// the weight gradients folded back into the fused layout after the
// weight-gradient GEMMs. The copies are the CPU's business: the ops and
// the saved tensors are those of the unfused experts (the count of a
// grouped GEMM does not depend on how its weights are stored).

// expertMats are one layer's routed-expert weights (or gradients) in
// linear's layout, indexed by global expert; the biases are nil without
// Config.ExpertBias. An expert whose weight is nil is not held here.
type expertMats[T Float] struct {
	gate, up, down    [][]T // [F, D], [F, D], [D, F]
	gateB, upB, downB [][]T // [F], [F], [D]
}

// expertViews assigns one layer's routed-expert tensors in Params' order
// (moe/params.go expertParams, moe/fused.go fusedExpertParams); the bias
// slices stay nil without Config.ExpertBias.
func expertViews[T Float](c *moe.Config, lw *LayerWeights[T], next func(int) []T) {
	D, F, E, bias := c.Hidden, c.ExpertFFN, c.Experts, c.ExpertBias
	mats := func(n int) [][]T { return make([][]T, n) }
	biases := func() [][]T {
		if bias {
			return make([][]T, E)
		}
		return nil
	}
	// view takes the next tensor of n elements into list[e], and its bias of
	// nb elements into biasList[e] when the experts have biases.
	view := func(list, biasList [][]T, e, n, nb int) {
		list[e] = next(n)
		if bias {
			biasList[e] = next(nb)
		}
	}
	lw.ExpDownBias = biases()
	if c.FusedExperts {
		lw.ExpGateUp, lw.ExpGateUpBias, lw.ExpDownIn = mats(E), biases(), mats(E)
		for e := 0; e < E; e++ {
			view(lw.ExpGateUp, lw.ExpGateUpBias, e, D*2*F, 2*F)
			view(lw.ExpDownIn, lw.ExpDownBias, e, F*D, D)
		}
		return
	}
	lw.ExpGate, lw.ExpUp, lw.ExpDown = mats(E), mats(E), mats(E)
	lw.ExpGateBias, lw.ExpUpBias = biases(), biases()
	for e := 0; e < E; e++ {
		view(lw.ExpGate, lw.ExpGateBias, e, F*D, F)
		view(lw.ExpUp, lw.ExpUpBias, e, F*D, F)
		view(lw.ExpDown, lw.ExpDownBias, e, D*F, D)
	}
}

// expertWeights returns w's routed experts in linear's layout: views of
// w, or de-interleaved (or halved) and transposed copies of its fused tensors.
func expertWeights[T Float](c *moe.Config, w *LayerWeights[T]) expertMats[T] {
	if !c.FusedExperts {
		return expertMats[T]{w.ExpGate, w.ExpUp, w.ExpDown, w.ExpGateBias, w.ExpUpBias, w.ExpDownBias}
	}
	m := newUnfused[T](c, w.ExpGateUp, w.ExpDownBias != nil)
	D, F := c.Hidden, c.ExpertFFN
	gi, ui := gateUpCols(c)
	for e, gu := range w.ExpGateUp {
		if gu == nil {
			continue
		}
		for d := 0; d < D; d++ {
			for f := 0; f < F; f++ {
				m.gate[e][f*D+d], m.up[e][f*D+d] = gu[d*2*F+gi(f)], gu[d*2*F+ui(f)]
			}
		}
		for f := 0; f < F; f++ {
			for d := 0; d < D; d++ {
				m.down[e][d*F+f] = w.ExpDownIn[e][f*D+d]
			}
		}
		if m.gateB != nil {
			for f := 0; f < F; f++ {
				m.gateB[e][f], m.upB[e][f] = w.ExpGateUpBias[e][gi(f)], w.ExpGateUpBias[e][ui(f)]
			}
			m.downB[e] = w.ExpDownBias[e]
		}
	}
	return m
}

// gateUpCols gives the columns of gate and up feature f in a fused
// gate_up_proj's 2F: interleaved 2f, 2f+1 (GPT-OSS), or the halves f, F+f
// under Config.FusedHalves (Llama4TextExperts' gate_up.chunk(2)).
func gateUpCols(c *moe.Config) (gate, up func(f int) int) {
	if F := c.ExpertFFN; c.FusedHalves {
		return func(f int) int { return f }, func(f int) int { return F + f }
	}
	return func(f int) int { return 2 * f }, func(f int) int { return 2*f + 1 }
}

// newUnfused allocates linear-layout matrices for the experts whose fused
// gate_up tensor is held (non-nil).
func newUnfused[T Float](c *moe.Config, held [][]T, bias bool) expertMats[T] {
	D, F, E := c.Hidden, c.ExpertFFN, c.Experts
	m := expertMats[T]{gate: make([][]T, E), up: make([][]T, E), down: make([][]T, E)}
	if bias {
		m.gateB, m.upB, m.downB = make([][]T, E), make([][]T, E), make([][]T, E)
	}
	for e, h := range held {
		if h == nil {
			continue
		}
		m.gate[e], m.up[e], m.down[e] = make([]T, F*D), make([]T, F*D), make([]T, D*F)
		if bias {
			m.gateB[e], m.upB[e], m.downB[e] = make([]T, F), make([]T, F), make([]T, D)
		}
	}
	return m
}

// expertGrads returns the gradient accumulators of g's routed experts in
// linear's layout and the function that adds them into g (a no-op when g
// is not fused: the views are g's own).
func expertGrads[T Float](c *moe.Config, g *LayerWeights[T]) (expertMats[T], func()) {
	if !c.FusedExperts {
		return expertMats[T]{g.ExpGate, g.ExpUp, g.ExpDown, g.ExpGateBias, g.ExpUpBias, g.ExpDownBias}, func() {}
	}
	m := newUnfused[T](c, g.ExpGateUp, g.ExpDownBias != nil)
	D, F := c.Hidden, c.ExpertFFN
	gi, ui := gateUpCols(c)
	fold := func() {
		for e, gu := range g.ExpGateUp {
			if gu == nil {
				continue
			}
			for d := 0; d < D; d++ {
				for f := 0; f < F; f++ {
					gu[d*2*F+gi(f)] += m.gate[e][f*D+d]
					gu[d*2*F+ui(f)] += m.up[e][f*D+d]
				}
			}
			for f := 0; f < F; f++ {
				for d := 0; d < D; d++ {
					g.ExpDownIn[e][f*D+d] += m.down[e][d*F+f]
				}
			}
			if m.gateB != nil {
				for f := 0; f < F; f++ {
					g.ExpGateUpBias[e][gi(f)] += m.gateB[e][f]
					g.ExpGateUpBias[e][ui(f)] += m.upB[e][f]
				}
				for d, v := range m.downB[e] {
					g.ExpDownBias[e][d] += v
				}
			}
		}
	}
	return m, fold
}

// addGroupBias adds bias[e] [n] to each of expert e's rows of y [rows, n]
// (rows in expert order, off from offsets); nil biases add nothing.
func addGroupBias[T Float](y []T, bias [][]T, off []int, n int) {
	if bias == nil {
		return
	}
	for e, b := range bias {
		for r := off[e]; r < off[e+1]; r++ {
			for j, v := range b {
				y[r*n+j] += v
			}
		}
	}
}

// groupBiasGrad accumulates into db[e] [n] the column sums of expert e's
// rows of dy [rows, n]; nil biases take nothing.
func groupBiasGrad[T Float](db [][]T, dy []T, off []int, n int) {
	if db == nil {
		return
	}
	for e, b := range db {
		for r := off[e]; r < off[e+1]; r++ {
			for j := range b {
				b[j] += dy[r*n+j]
			}
		}
	}
}
