package moe

import "math"

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

// rmsNormFwd writes y [rows,n] and rstd [rows] from x [rows,n] and w [n].
func rmsNormFwd[T Float](y, rstd, x, w []T, n int, eps float64) {
	rows := len(x) / n
	for i := 0; i < rows; i++ {
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
	rows := len(x) / n
	for i := 0; i < rows; i++ {
		xi, dyi, dxi := x[i*n:i*n+n], dy[i*n:i*n+n], dx[i*n:i*n+n]
		r := rstd[i]
		var dot T
		for j, v := range xi {
			xh := v * r
			dw[j] += dyi[j] * xh
			dot += dyi[j] * w[j] * xh
		}
		mean := dot / T(n)
		for j, v := range xi {
			xh := v * r
			dxi[j] += r * (dyi[j]*w[j] - xh*mean)
		}
	}
}
