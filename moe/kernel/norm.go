package kernel

import "math"

// RMSNorm of the reference model in float32 (package moe/ref's rmsNormFwd and
// rmsNormBwd for T = float32), on every core and in AVX2 vectors where the
// CPU has them:
//
//	r = 1/√(Σx²/n + ε),  y = w ⊙ (x·r)
//	dw += Σ_rows dy ⊙ (x·r),  dx += r·(dy ⊙ w − (x·r)·mean(dy ⊙ w ⊙ x·r))
//
// The plain-Go rows below are the oracle: package moe/ref's loops, one element
// after another. The AVX2 rows round every element-wise product and
// difference as those loops do; their two sums (Σx² and the mean) add in
// float64 lanes, so r and the mean can differ from the oracle's in the last
// place of float32 (the oracle's mean sums float32 terms in float32).
var (
	normSumSqRow = normSumSqGo
	normScaleRow = normScaleGo
	normDotRow   = normDotGo
	normDxRow    = normDxGo
	normDwRow    = normDwGo
)

// RMSNorm writes y and rstd (one r per row) from x and w for rows of n
// elements (len(x)/n rows), in parallel over rows.
func RMSNorm(y, rstd, x, w []float32, n int, eps float64) {
	if n <= 0 {
		panic("kernel: RMSNorm: row length n must be positive")
	}
	rows := len(x) / n
	if len(y) < rows*n || len(rstd) < rows || len(w) < n {
		panic("kernel: RMSNorm: slices shorter than x's rows")
	}
	ParallelFor(rows, 2*n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			xi := x[i*n : i*n+n]
			r := float32(1 / math.Sqrt(normSumSqRow(xi)/float64(n)+eps))
			rstd[i] = r
			normScaleRow(y[i*n:i*n+n], xi, w[:n], r)
		}
	})
}

// RMSNormBackward accumulates dx and dw from dy, RMSNorm's input x, its
// rstd and w: dx in parallel over rows, dw over columns, each column summed
// over the rows in order, so the result does not depend on the cores.
func RMSNormBackward(dx, dw, dy, x, rstd, w []float32, n int) {
	if n <= 0 {
		panic("kernel: RMSNormBackward: row length n must be positive")
	}
	rows := len(x) / n
	if len(dx) < rows*n || len(dy) < rows*n || len(rstd) < rows || len(dw) < n || len(w) < n {
		panic("kernel: RMSNormBackward: slices shorter than x's rows")
	}
	ParallelFor(rows, 3*n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			xi, dyi, r := x[i*n:i*n+n], dy[i*n:i*n+n], rstd[i]
			mean := float32(normDotRow(dyi, w[:n], xi, r) / float64(n))
			normDxRow(dx[i*n:i*n+n], dyi, w[:n], xi, r, mean)
		}
	})
	ParallelFor(n, 2*rows, func(lo, hi int) {
		for i := 0; i < rows; i++ {
			normDwRow(dw[lo:hi], dy[i*n+lo:i*n+hi], x[i*n+lo:i*n+hi], rstd[i])
		}
	})
}

func normSumSqGo(x []float32) float64 {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	return ss
}

func normScaleGo(y, x, w []float32, r float32) {
	y, w = y[:len(x)], w[:len(x)]
	for j, v := range x {
		y[j] = w[j] * (v * r)
	}
}

func normDotGo(dy, w, x []float32, r float32) float64 {
	dy, w = dy[:len(x)], w[:len(x)]
	var dot float32
	for j, v := range x {
		dot += dy[j] * w[j] * (v * r)
	}
	return float64(dot)
}

func normDxGo(dx, dy, w, x []float32, r, mean float32) {
	dx, dy, w = dx[:len(x)], dy[:len(x)], w[:len(x)]
	for j, v := range x {
		xh := v * r
		dx[j] += r * (dy[j]*w[j] - xh*mean)
	}
}

func normDwGo(dw, dy, x []float32, r float32) {
	dw, dy = dw[:len(x)], dy[:len(x)]
	for j, v := range x {
		dw[j] += dy[j] * (v * r)
	}
}
