package attn

import (
	"math"
	"testing"
)

// TestL2NormByHand: rows (3, 4) and (1, −1) with ε = 0. By hand: mean of
// squares 12.5 and 1, so r = 1/√12.5 = 0.28284271… and 1; y = (0.8485…,
// 1.1314…) and (1, −1). Backward of L = Σ dy·y with dy = (1, 0) on the
// first row: dx_j = r·(dy_j − x_j·r²·(dy·x)/n) = r·((1, 0) − (3, 4)·3/25)
// = r·(16/25, −12/25).
func TestL2NormByHand(t *testing.T) {
	x := []float64{3, 4, 1, -1}
	y, rstd := make([]float64, 4), make([]float64, 2)
	L2NormForward(y, rstd, x, 2, 0)
	r := 1 / math.Sqrt(12.5)
	for i, w := range []float64{3 * r, 4 * r, 1, -1} {
		if math.Abs(y[i]-w) > 1e-15 {
			t.Errorf("y[%d] = %v, want %v", i, y[i], w)
		}
	}
	dx := make([]float64, 4)
	L2NormBackward(dx, []float64{1, 0, 0, 0}, x, rstd, 2)
	for i, w := range []float64{r * 16 / 25, -r * 12 / 25, 0, 0} {
		if math.Abs(dx[i]-w) > 1e-15 {
			t.Errorf("dx[%d] = %v, want %v", i, dx[i], w)
		}
	}
}

// TestL2NormFiniteDifferences: the backward against central differences of
// Σ dy·y with ε = 1e-5, over a row of 6.
func TestL2NormFiniteDifferences(t *testing.T) {
	x := []float64{0.3, -1.2, 0.7, 2.1, -0.4, 0.05}
	dy := []float64{0.5, 1, -2, 0.25, 0.1, -0.7}
	f := func() float64 {
		y, r := make([]float64, 6), make([]float64, 1)
		L2NormForward(y, r, x, 6, 1e-5)
		var s float64
		for i := range y {
			s += y[i] * dy[i]
		}
		return s
	}
	y, rstd, dx := make([]float64, 6), make([]float64, 1), make([]float64, 6)
	L2NormForward(y, rstd, x, 6, 1e-5)
	L2NormBackward(dx, dy, x, rstd, 6)
	for i := range x {
		x0 := x[i]
		x[i] = x0 + 1e-6
		up := f()
		x[i] = x0 - 1e-6
		dn := f()
		x[i] = x0
		if fd := (up - dn) / 2e-6; math.Abs(fd-dx[i]) > 1e-8 {
			t.Errorf("dx[%d] = %v, finite difference %v", i, dx[i], fd)
		}
	}
}

// TestScaleQueries: two sequences of two tokens, width 2, factors (1, 1.5)
// by position: the second token of each sequence is scaled, the first not.
func TestScaleQueries(t *testing.T) {
	x := []float64{1, 2, 1, 2, 3, 4, 3, 4}
	ScaleQueries(x, 2, []float64{1, 1.5})
	for i, w := range []float64{1, 2, 1.5, 3, 3, 4, 4.5, 6} {
		if x[i] != w {
			t.Errorf("x[%d] = %v, want %v", i, x[i], w)
		}
	}
}
