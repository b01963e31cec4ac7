package kernel

import "math"

// Row operations of the attention kernel, on contiguous float32 rows. The
// plain-Go versions below are the oracle; dispatch_amd64.go replaces them
// with AVX2+FMA assembly where the CPU has it (a Go tail finishes rows whose
// length is not a multiple of 8).
var (
	// expSubSumRow sets x[j] = exp(x[j] − m) and returns Σ x[j]; an
	// argument below expMin gives exactly 0 (masked scores are −∞).
	expSubSumRow = expSubSumGo
	// maxRow returns max(m, max_j x[j]).
	maxRow = maxGo
	// scaleRow sets x[j] *= a.
	scaleRow = scaleGo
	// dsRow sets ds[j] = p[j]·(ds[j] − d)·c.
	dsRow = dsGo
	// dotRow returns Σ x[j]·y[j].
	dotRow = dotGo
)

// expMin is where float32 exp leaves the normal range: exp(−87.34) ≈
// 1.2e-38, the smallest normal float32.
const expMin = -87.3365447505531

func expf(x float32) float32 {
	if x < expMin {
		return 0
	}
	return float32(math.Exp(float64(x)))
}

func expSubSumGo(x []float32, m float32) float32 {
	var s float32
	for j, v := range x {
		e := expf(v - m)
		x[j] = e
		s += e
	}
	return s
}

func maxGo(x []float32, m float32) float32 {
	for _, v := range x {
		m = max(m, v)
	}
	return m
}

func scaleGo(x []float32, a float32) {
	for j := range x {
		x[j] *= a
	}
}

func dsGo(ds, p []float32, d, c float32) {
	p = p[:len(ds)]
	for j, v := range ds {
		ds[j] = p[j] * (v - d) * c
	}
}

func dotGo(x, y []float32) float32 {
	y = y[:len(x)]
	var s float32
	for j, v := range x {
		s += v * y[j]
	}
	return s
}
