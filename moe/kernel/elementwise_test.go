package kernel

import (
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// TestParallelFor: every index in [0, n) is visited exactly once, by
// contiguous chunks, for sizes on either side of the parallel threshold and
// for one and two threads.
func TestParallelFor(t *testing.T) {
	for _, threads := range []int{1, 2, 3} {
		prev := SetThreads(threads)
		for _, n := range []int{0, 1, 2, 3, 7, 1000, parallelMinElems + 1, 3*parallelMinElems + 5} {
			seen := make([]int32, n)
			var calls atomic.Int32
			ParallelFor(n, 1, func(lo, hi int) {
				calls.Add(1)
				if lo >= hi {
					t.Errorf("threads=%d n=%d: empty chunk [%d, %d)", threads, n, lo, hi)
				}
				for i := lo; i < hi; i++ {
					atomic.AddInt32(&seen[i], 1)
				}
			})
			for i, s := range seen {
				if s != 1 {
					t.Fatalf("threads=%d n=%d: index %d visited %d times", threads, n, i, s)
				}
			}
			if c := int(calls.Load()); c > max(threads, 1) {
				t.Errorf("threads=%d n=%d: %d chunks, want at most %d", threads, n, c, threads)
			}
		}
		SetThreads(prev)
	}
}

// TestSwiGLU compares the dispatched activations (AVX2 where the CPU has
// it, on every core) with the plain-Go loops on one core. The plain loop
// rounds a float64 σ; the assembly uses a float32 exp (Cephes, relative
// error about 1e-7) and a float32 division, so σ differs by a few ulp: sg,
// a and du within 1e-6 relative. dg multiplies σ by 1 + g·(1 − σ), which
// cancels near g = −1.28, so its bound is relative to the size of the
// terms, |da·u|·(1 + |g|). exp8 clamps its argument at 88.38, so for g
// below −88.38 the assembly's σ is 4.7e-39 where the true one is a
// denormal or 0: an absolute difference of at most 4.7e-39·|g·u·da|, below
// 1e-33 for these inputs.
func TestSwiGLU(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 8))
	for _, n := range []int{0, 1, 7, 8, 9, 31, 100, 3 * parallelMinElems} {
		g, u, da := make([]float32, n), make([]float32, n), make([]float32, n)
		for i := range g {
			g[i] = float32(r.NormFloat64() * 4)
			if r.IntN(50) == 0 {
				g[i] = float32(r.NormFloat64() * 200) // beyond exp's range both ways
			}
			u[i], da[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
		}
		sg, a, sgW, aW := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
		dg, du, dgW, duW := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
		SwiGLU(sg, a, g, u)
		swigluGo(sgW, aW, g, u)
		SwiGLUBackward(dg, du, da, g, sg, u)
		swigluBwdGo(dgW, duW, da, g, sg, u)
		rel := func(what string, i int, got, want, scale float32, tol float64) {
			t.Helper()
			if d := math.Abs(float64(got - want)); !(d <= tol*math.Abs(float64(scale))+1e-33) {
				t.Fatalf("n=%d %s[%d] (g = %v): %v, want %v", n, what, i, g[i], got, want)
			}
		}
		for i := range g {
			rel("sg", i, sg[i], sgW[i], sgW[i], 1e-6)
			rel("a", i, a[i], aW[i], aW[i], 1e-6)
			rel("du", i, du[i], duW[i], duW[i], 1e-6)
			rel("dg", i, dg[i], dgW[i], da[i]*u[i]*(1+float32(math.Abs(float64(g[i])))), 1e-6)
		}
	}
}

// TestAddAxpy: the vector sum and scaled sum give the plain loops' bits,
// for lengths around the 8-lane width and across the parallel threshold.
func TestAddAxpy(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 1))
	for _, n := range []int{0, 1, 7, 8, 9, 33, 2*parallelMinElems + 3} {
		a, b := randSlice(r, n), randSlice(r, n)
		got, want := make([]float32, n), make([]float32, n)
		Add(got, a, b)
		addGo(want, a, b)
		y1, y2 := append([]float32(nil), a...), append([]float32(nil), a...)
		Axpy(y1, b, 0.3)
		axpyGo(y2, b, 0.3)
		for i := range got {
			if got[i] != want[i] || y1[i] != y2[i] {
				t.Fatalf("n=%d [%d]: Add %v want %v, Axpy %v want %v", n, i, got[i], want[i], y1[i], y2[i])
			}
		}
	}
}
