package attn

import (
	"math"

	"github.com/moescope/moescope/moe/kernel"
)

// Llama 4's QK-norm (Llama4TextL2Norm in modeling_llama4.py, transformers
// 000c33fd): each head vector x of n = d elements, after RoPE, divided by
// its root mean square, with no weight:
//
//	r = 1/√(Σ_i x_i²/n + ε),  y = r·x
//
// Backward, from ∂r/∂x_j = −r³·x_j/n:
//
//	dx_j = r·(dy_j − x_j·r²·Σ_i dy_i·x_i / n)
//
// Sums add in float64 (as moe/ref's RMSNorm does), so a row's result does
// not depend on how rows are split over the cores.

// L2NormForward writes y and rstd [rows] from x [rows, n].
func L2NormForward[T Float](y, rstd, x []T, n int, eps float64) {
	kernel.ParallelFor(len(x)/n, 2*n, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr := x[r*n : r*n+n]
			var ss float64
			for _, v := range xr {
				ss += float64(v) * float64(v)
			}
			rs := T(1 / math.Sqrt(ss/float64(n)+eps))
			rstd[r] = rs
			for i, v := range xr {
				y[r*n+i] = v * rs
			}
		}
	})
}

// L2NormBackward writes dx [rows, n] from dy and the forward's x and rstd.
func L2NormBackward[T Float](dx, dy, x, rstd []T, n int) {
	kernel.ParallelFor(len(x)/n, 3*n, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, dyr := x[r*n:r*n+n], dy[r*n:r*n+n]
			var dot float64
			for i, v := range xr {
				dot += float64(dyr[i]) * float64(v)
			}
			rs := float64(rstd[r])
			c := rs * rs * dot / float64(n)
			for i, v := range xr {
				dx[r*n+i] = T(rs * (float64(dyr[i]) - float64(v)*c))
			}
		}
	})
}
