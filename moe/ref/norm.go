package ref

import (
	"math"

	"github.com/moescope/moescope/moe/kernel"
)

// RMSNorm as Hugging Face's Qwen3MoeRMSNorm computes it, row by row over
// rows of n elements:
//
//	r = 1/√(mean(x²) + ε),  y = w ⊙ (x·r)
//
// Backward, with x̂ = x·r and g = dy ⊙ w:
//
//	dw += Σ_rows dy ⊙ x̂,   dx = r·(g − x̂·mean(g ⊙ x̂))
//
// PyTorch's fused RMSNorm keeps the input and r (float32) for backward
// (derivatives.yaml, _fused_rms_norm: input, weight and result1 = rstd);
// so does this one.
//
// Both run on every core (kernel.ParallelFor) and compute exactly what one
// core computes: forward and backward's dx are independent per row, and
// backward's dw is split by columns, each summed over the rows in order.
// In float32 they are kernel.RMSNorm and kernel.RMSNormBackward: these
// loops' formulas in AVX2 vectors where the CPU has them (their sums of
// squares and means add in float64 lanes, so r and the mean can differ
// from these loops' in float32's last place; every other rounding is the
// same).

// rmsNormFwd writes y [rows,n] and rstd [rows] from x [rows,n] and w [n].
func rmsNormFwd[T Float](y, rstd, x, w []T, n int, eps float64) {
	if x32, ok := any(x).([]float32); ok {
		kernel.RMSNorm(any(y).([]float32), any(rstd).([]float32), x32, any(w).([]float32), n, eps)
		return
	}
	kernel.ParallelFor(len(x)/n, 2*n, func(lo, hi int) { rmsNormFwdRows(y, rstd, x, w, n, eps, lo, hi) })
}

// rmsNormFwdRows is rmsNormFwd on rows [lo, hi).
func rmsNormFwdRows[T Float](y, rstd, x, w []T, n int, eps float64, lo, hi int) {
	for i := lo; i < hi; i++ {
		xi := x[i*n : i*n+n]
		var ss float64
		for _, v := range xi {
			ss += float64(v) * float64(v)
		}
		r := T(1 / math.Sqrt(ss/float64(n)+eps))
		rstd[i] = r
		yi := y[i*n : i*n+n]
		for j, v := range xi {
			yi[j] = w[j] * (v * r)
		}
	}
}

// rmsNormBwd accumulates dx and dw from dy, the saved input x and rstd.
func rmsNormBwd[T Float](dx, dw, dy, x, rstd, w []T, n int) {
	if x32, ok := any(x).([]float32); ok {
		kernel.RMSNormBackward(any(dx).([]float32), any(dw).([]float32), any(dy).([]float32), x32, any(rstd).([]float32), any(w).([]float32), n)
		return
	}
	rows := len(x) / n
	kernel.ParallelFor(rows, 3*n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			xi, dyi, dxi := x[i*n:i*n+n], dy[i*n:i*n+n], dx[i*n:i*n+n]
			r := rstd[i]
			var dot T
			for j, v := range xi {
				dot += dyi[j] * w[j] * (v * r)
			}
			mean := dot / T(n)
			for j, v := range xi {
				xh := v * r
				dxi[j] += r * (dyi[j]*w[j] - xh*mean)
			}
		}
	})
	kernel.ParallelFor(n, 2*rows, func(lo, hi int) {
		dwc := dw[lo:hi]
		for i := 0; i < rows; i++ {
			xi, dyi, r := x[i*n+lo:i*n+hi], dy[i*n+lo:i*n+hi], rstd[i]
			for j, v := range xi {
				dwc[j] += dyi[j] * (v * r)
			}
		}
	})
}
