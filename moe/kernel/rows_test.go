package kernel

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestRows compares the dispatched row operations (assembly where the CPU
// has it) with the plain-Go ones, and exp with math.Exp.
func TestRows(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 3))
	inf := float32(math.Inf(-1))
	near := func(what string, n int, got, want float32, tol float64) {
		t.Helper()
		if d := math.Abs(float64(got - want)); !(d <= tol*(1+math.Abs(float64(want)))) {
			t.Fatalf("%s n=%d: %v, want %v", what, n, got, want)
		}
	}
	for n := 0; n < 70; n++ {
		x := make([]float32, n)
		for j := range x {
			x[j] = r.Float32()*200 - 150 // below exp's range, up to e^50
			if r.IntN(7) == 0 {
				x[j] = inf
			}
		}
		m := r.Float32() * 10
		got, want := append([]float32(nil), x...), append([]float32(nil), x...)
		sg, sw := expSubSumRow(got, m), expSubSumGo(want, m)
		near("expSubSum sum", n, sg, sw, 1e-6)
		for j := range got {
			near("expSubSum", n, got[j], want[j], 3e-7)
			if x[j]-m < expMin && got[j] != 0 {
				t.Fatalf("exp(%v) = %v, want exactly 0 below the normal range", x[j]-m, got[j])
			}
		}
		near("max", n, maxRow(x, -1e30), maxGo(x, -1e30), 0)
		y, p := make([]float32, n), make([]float32, n)
		for j := range y {
			y[j], p[j] = r.Float32()-0.5, r.Float32()
		}
		near("dot", n, dotRow(y, p), dotGo(y, p), 1e-6)
		a, b := append([]float32(nil), y...), append([]float32(nil), y...)
		scaleRow(a, 0.37)
		scaleGo(b, 0.37)
		for j := range a {
			near("scale", n, a[j], b[j], 0)
		}
		a, b = append([]float32(nil), y...), append([]float32(nil), y...)
		dsRow(a, p, 0.2, 0.09)
		dsGo(b, p, 0.2, 0.09)
		for j := range a {
			near("ds", n, a[j], b[j], 1e-7)
		}
	}
	// exp against float64 math.Exp across float32's normal range.
	x := make([]float32, 4096)
	for j := range x {
		x[j] = -87 + 175*float32(j)/float32(len(x))
	}
	want := append([]float32(nil), x...)
	expSubSumRow(x, 0)
	for j, v := range want {
		near("exp", j, x[j], float32(math.Exp(float64(v))), 3e-7)
	}
}

// TestAttentionGoRows runs attention on the plain-Go row operations.
func TestAttentionGoRows(t *testing.T) {
	useAsmRows(false)
	defer useAsmRows(true)
	a := AttnShape{Batch: 1, Seq: 77, Heads: 4, KVHeads: 2, HeadDim: 12, Window: 30}
	r := rand.New(rand.NewPCG(6, 6))
	T := a.Seq
	q, k, v, do := randSlice(r, T*48), randSlice(r, T*24), randSlice(r, T*24), randSlice(r, T*48)
	o, lse := make([]float32, len(q)), make([]float32, T*4)
	AttentionForward(o, lse, q, k, v, a)
	dq, dk, dv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
	AttentionBackward(dq, dk, dv, do, q, k, v, o, lse, a)
	wo, wlse, wdq, wdk, wdv := attnRef(a, q, k, v, do)
	closeTo(t, "o", o, wo, 1e-5)
	closeTo(t, "lse", lse, wlse, 1e-5)
	closeTo(t, "dq", dq, wdq, 2e-5)
	closeTo(t, "dk", dk, wdk, 2e-5)
	closeTo(t, "dv", dv, wdv, 2e-5)
}
