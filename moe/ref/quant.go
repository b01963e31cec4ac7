package ref

import (
	"math/rand/v2"
	"sync"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/quant"
)

// Quantize fake-quantises the operands of the GEMMs a low-precision recipe
// converts (Options.Quantize): each converted GEMM multiplies, in float32,
// exactly the values the recipe's FP8 or FP4 GEMM multiplies, so a run
// shows the recipe's effect on the loss and the gradients. Linear converts
// the attention projections and the dense and shared-expert FFNs, Experts
// the routed experts' grouped GEMMs, Output the output head (moe/job's
// GEMM sets); the router never. A weight with a dimension not a multiple
// of 16 is never converted (torchtitan's module filter; job.GEMMSetOf), nor
// are the recipe's BF16LastLayers last blocks. Float32 models only.
type Quantize struct {
	Recipe                  quant.Recipe
	Linear, Experts, Output bool
	// Layers is the model's block count (for Recipe.BF16LastLayers).
	Layers int

	mu  sync.Mutex // guards rng: blocks may run on several goroutines
	rng *rand.Rand
}

// NewQuantize returns the fake quantisation of recipe r over the given GEMM
// sets of a model of layers blocks; stochastic rounding draws from a
// generator seeded with seed.
func NewQuantize(r quant.Recipe, linear, experts, output bool, layers int, seed uint64) *Quantize {
	return &Quantize{Recipe: r, Linear: linear, Experts: experts, Output: output, Layers: layers, rng: quant.NewRand(seed)}
}

// gemm is one of a linear layer's three GEMMs.
type gemm int

const (
	gemmForward gemm = iota
	gemmDataGrad
	gemmWeightGrad
)

// converts says whether op's GEMM with weight [n, k] in block layer is
// fake-quantised.
func (q *Quantize) converts(op moe.Op, layer, n, k int) bool {
	if q == nil || n%16 != 0 || k%16 != 0 {
		return false
	}
	if layer < q.Layers && layer >= q.Layers-q.Recipe.BF16LastLayers {
		return false
	}
	switch op {
	case moe.OpRouter, moe.OpSharedExpGate:
		return false
	case moe.OpLMHead:
		return q.Output
	case moe.OpExpertGate, moe.OpExpertUp, moe.OpExpertDown:
		return q.Experts
	}
	return q.Linear
}

// operands returns the fake-quantised operands of GEMM g over m rows of a
// linear with weight [n, k]: forward (x [m,k], W), data gradient (dy [m,n],
// W), weight gradient (dy, x). a and b are those two operands in order.
func (q *Quantize) operands(g gemm, a, b []float32, m, n, k int) (qa, qb []float32) {
	r := q.Recipe
	qa, qb = make([]float32, len(a)), make([]float32, len(b))
	q.mu.Lock()
	defer q.mu.Unlock()
	switch g {
	case gemmForward: // x·Wᵀ contracts over k
		r.Forward[0].Apply(qa, a, m, k, quant.AlongCols, q.rng)
		r.Forward[1].Apply(qb, b, n, k, quant.AlongCols, q.rng)
	case gemmDataGrad: // dy·W contracts over n
		r.DataGrad[0].Apply(qa, a, m, n, quant.AlongCols, q.rng)
		r.DataGrad[1].Apply(qb, b, n, k, quant.AlongRows, q.rng)
	case gemmWeightGrad: // dyᵀ·x contracts over the m rows
		r.WeightGrad[0].Apply(qa, a, m, n, quant.AlongRows, q.rng)
		r.WeightGrad[1].Apply(qb, b, m, k, quant.AlongRows, q.rng)
	}
	return qa, qb
}

// quantPair is operands for the reference's element type: float32 only
// (a float64 model with Quantize set is a programming error).
func quantPair[T Float](q *Quantize, op moe.Op, layer int, g gemm, a, b []T, m, n, k int) ([]T, []T) {
	if !q.converts(op, layer, n, k) {
		return a, b
	}
	a32, ok := any(a).([]float32)
	if !ok {
		panic("ref: fake quantisation needs a float32 model")
	}
	qa, qb := q.operands(g, a32, any(b).([]float32), m, n, k)
	return any(qa).([]T), any(qb).([]T)
}

// quantGrouped fake-quantises a grouped GEMM's operands expert by expert
// (each expert's rows off[e]..off[e+1] and weight are tensors of their own,
// as TransformerEngine's GroupedLinear and torchao's grouped GEMMs quantise
// them): a has rows×(a's width), w the experts' weights [n, k]. The
// forward and data gradient pass a and w (b nil), the weight gradient a
// and b (w nil).
func quantGrouped[T Float](q *Quantize, op moe.Op, layer int, g gemm, a, b []T, w [][]T, off []int, n, k int) ([]T, []T, [][]T) {
	if !q.converts(op, layer, n, k) {
		return a, b, w
	}
	qa, qb := make([]T, len(a)), make([]T, len(b))
	qw := make([][]T, len(w))
	aw, bw := len(a)/max(off[len(off)-1], 1), len(b)/max(off[len(off)-1], 1)
	for e := range len(off) - 1 {
		r0, r1 := off[e], off[e+1]
		if r1 == r0 {
			if w != nil {
				qw[e] = w[e]
			}
			continue
		}
		var sa, sb []T
		if g == gemmWeightGrad {
			sa, sb = quantPair(q, op, layer, g, a[r0*aw:r1*aw], b[r0*bw:r1*bw], r1-r0, n, k)
			copy(qb[r0*bw:], sb)
		} else {
			sa, qw[e] = quantPair(q, op, layer, g, a[r0*aw:r1*aw], w[e], r1-r0, n, k)
		}
		copy(qa[r0*aw:], sa)
	}
	return qa, qb, qw
}
