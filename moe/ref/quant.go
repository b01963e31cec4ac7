package ref

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/quant"
)

// gemm is one of a linear layer's three GEMMs.
type gemm int

const (
	gemmForward gemm = iota
	gemmDataGrad
	gemmWeightGrad
)

// converts says whether op's GEMM with weight [n, k] in block layer is
// fake-quantised under q (Options.Quantize): the router never, a weight
// with a dimension not a multiple of 16 never (torchtitan's module filter;
// job.GEMMSetOf), nor the recipe's BF16 last blocks.
func converts(q *quant.GEMMs, op moe.Op, layer, n, k int) bool {
	if q == nil || n%16 != 0 || k%16 != 0 || q.HighPrecisionLayer(layer) {
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
func operands(q *quant.GEMMs, g gemm, a, b []float32, m, n, k int) (qa, qb []float32) {
	r := q.Recipe
	qa, qb = make([]float32, len(a)), make([]float32, len(b))
	switch g {
	case gemmForward: // x·Wᵀ contracts over k
		q.Apply(r.Forward[0], qa, a, m, k, quant.AlongCols)
		q.Apply(r.Forward[1], qb, b, n, k, quant.AlongCols)
	case gemmDataGrad: // dy·W contracts over n
		q.Apply(r.DataGrad[0], qa, a, m, n, quant.AlongCols)
		q.Apply(r.DataGrad[1], qb, b, n, k, quant.AlongRows)
	case gemmWeightGrad: // dyᵀ·x contracts over the m rows
		q.Apply(r.WeightGrad[0], qa, a, m, n, quant.AlongRows)
		q.Apply(r.WeightGrad[1], qb, b, m, k, quant.AlongRows)
	}
	return qa, qb
}

// quantPair is operands for the reference's element type: float32 only
// (a float64 model with Quantize set is a programming error).
func quantPair[T Float](q *quant.GEMMs, op moe.Op, layer int, g gemm, a, b []T, m, n, k int) ([]T, []T) {
	if !converts(q, op, layer, n, k) {
		return a, b
	}
	a32, ok := any(a).([]float32)
	if !ok {
		panic("ref: fake quantisation needs a float32 model")
	}
	qa, qb := operands(q, g, a32, any(b).([]float32), m, n, k)
	return any(qa).([]T), any(qb).([]T)
}

// quantGrouped fake-quantises a grouped GEMM's operands expert by expert
// (each expert's rows off[e]..off[e+1] and weight are tensors of their own,
// as TransformerEngine's GroupedLinear and torchao's grouped GEMMs quantise
// them): a has rows×(a's width), w the experts' weights [n, k]. The
// forward and data gradient pass a and w (b nil), the weight gradient a
// and b (w nil).
func quantGrouped[T Float](q *quant.GEMMs, op moe.Op, layer int, g gemm, a, b []T, w [][]T, off []int, n, k int) ([]T, []T, [][]T) {
	if !converts(q, op, layer, n, k) {
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
