package ref

import (
	"math"

	"github.com/moescope/moescope/moe/kernel"
	"github.com/moescope/moescope/moe/safetensors"
)

// Float is the element type of the reference implementation: float32 for
// speed (matmuls through kernel.Sgemm), float64 for finite-difference checks.
type Float interface{ ~float32 | ~float64 }

// The three GEMM layouts of a linear layer y = x·Wᵀ, row-major, x [M,K],
// W [N,K], y [M,N]:
//
//	linearFwd:  y  = x·Wᵀ        (overwrites y)
//	linearBwdX: dx += dy·W       (accumulates)
//	linearBwdW: dW += dyᵀ·x      (accumulates)
//
// float32 goes through kernel.Sgemm; float64 through the plain loops below.

func linearFwd[T Float](y, x, w []T, m, n, k int) {
	if m == 0 || n == 0 {
		return
	}
	if y32, ok := any(y).([]float32); ok {
		kernel.Sgemm(false, true, m, n, k, 1, any(x).([]float32), k, any(w).([]float32), k, 0, y32, n)
		return
	}
	for i := 0; i < m; i++ {
		xi := x[i*k : i*k+k]
		yi := y[i*n : i*n+n]
		for j := 0; j < n; j++ {
			wj := w[j*k : j*k+k]
			var s T
			for p, xv := range xi {
				s += xv * wj[p]
			}
			yi[j] = s
		}
	}
}

func linearBwdX[T Float](dx, dy, w []T, m, n, k int) {
	if m == 0 || n == 0 {
		return
	}
	if dx32, ok := any(dx).([]float32); ok {
		kernel.Sgemm(false, false, m, k, n, 1, any(dy).([]float32), n, any(w).([]float32), k, 1, dx32, k)
		return
	}
	for i := 0; i < m; i++ {
		dxi := dx[i*k : i*k+k]
		for j := 0; j < n; j++ {
			g := dy[i*n+j]
			if g == 0 {
				continue
			}
			wj := w[j*k : j*k+k]
			for p := range dxi {
				dxi[p] += g * wj[p]
			}
		}
	}
}

func linearBwdW[T Float](dw, dy, x []T, m, n, k int) {
	if m == 0 || n == 0 {
		return
	}
	if dw32, ok := any(dw).([]float32); ok {
		kernel.Sgemm(true, false, n, k, m, 1, any(dy).([]float32), n, any(x).([]float32), k, 1, dw32, k)
		return
	}
	for i := 0; i < m; i++ {
		xi := x[i*k : i*k+k]
		for j := 0; j < n; j++ {
			g := dy[i*n+j]
			if g == 0 {
				continue
			}
			dwj := dw[j*k : j*k+k]
			for p := range dwj {
				dwj[p] += g * xi[p]
			}
		}
	}
}

// roundBF16 rounds every element to the nearest bfloat16 (ties to even), as
// a GPU stores bf16 parameters and activations.
func roundBF16[T Float](x []T) {
	for i, v := range x {
		x[i] = T(safetensors.BF16ToFloat32(safetensors.Float32ToBF16(float32(v))))
	}
}

func sigmoid[T Float](x T) T { return T(1 / (1 + math.Exp(-float64(x)))) }

func exp[T Float](x T) T { return T(math.Exp(float64(x))) }

// addInto sets dst[i] = a[i] + b[i], on every core (each index its own);
// float32 in vectors (kernel.Add, the same bits).
func addInto[T Float](dst, a, b []T) {
	if d32, ok := any(dst).([]float32); ok {
		kernel.Add(d32, any(a).([]float32), any(b).([]float32))
		return
	}
	a, b = a[:len(dst)], b[:len(dst)]
	kernel.ParallelFor(len(dst), 3, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			dst[i] = a[i] + b[i]
		}
	})
}

// axpy sets y[j] += alpha·x[j] on the calling goroutine; float32 in vectors
// (kernel.Axpy, the same bits).
func axpy[T Float](y, x []T, alpha T) {
	if y32, ok := any(y).([]float32); ok {
		kernel.Axpy(y32, any(x).([]float32), float32(alpha))
		return
	}
	x = x[:len(y)]
	for j := range y {
		y[j] += alpha * x[j]
	}
}

// dot is Σ_j x[j]·y[j], in T, in order.
func dot[T Float](x, y []T) T {
	var s T
	for j, v := range x {
		s += v * y[j]
	}
	return s
}
