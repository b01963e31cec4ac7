package attn

import (
	"math"
	"math/rand/v2"
	"testing"
)

// naiveAttention is softmax(Scale·QKᵀ + mask)·V written directly, with
// value heads of a.vDim() dims.
func naiveAttention(q, k, v []float64, a Shape) []float64 {
	H, G, d, dv, s := a.Heads, a.KV, a.D, a.vDim(), a.Seq
	o := make([]float64, a.Batch*s*H*dv)
	for b := 0; b < a.Batch; b++ {
		for h := 0; h < H; h++ {
			g := h / (H / G)
			for i := 0; i < s; i++ {
				sc := make([]float64, s)
				mx := math.Inf(-1)
				for j := 0; j <= i; j++ {
					if !a.allowed(i, j) {
						continue
					}
					var dot float64
					for e := 0; e < d; e++ {
						dot += q[((b*s+i)*H+h)*d+e] * k[((b*s+j)*G+g)*d+e]
					}
					sc[j] = dot * a.Scale
					mx = max(mx, sc[j])
				}
				var sum float64
				for j := 0; j <= i; j++ {
					if a.allowed(i, j) {
						sc[j] = math.Exp(sc[j] - mx)
						sum += sc[j]
					}
				}
				for j := 0; j <= i; j++ {
					if a.allowed(i, j) {
						for e := 0; e < dv; e++ {
							o[((b*s+i)*H+h)*dv+e] += sc[j] / sum * v[((b*s+j)*G+g)*dv+e]
						}
					}
				}
			}
		}
	}
	return o
}

// TestFlashAttentionMatchesNaive checks the tiled kernel against the
// direct formula for several tiles and windows, and that the tile changes
// neither the output nor the gradients beyond rounding.
func TestFlashAttentionMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, w := range []int{0, 1, 3, 7, -1, -3} { // −c: chunks of c
		a := Shape{Batch: 2, Seq: 7, Heads: 4, KV: 2, D: 3, Window: max(w, 0), Chunk: max(-w, 0), Scale: 1 / math.Sqrt(3)}
		n := a.Batch * a.Seq
		q, k, v := make([]float64, n*a.Heads*a.D), make([]float64, n*a.KV*a.D), make([]float64, n*a.KV*a.D)
		for _, x := range [][]float64{q, k, v} {
			for i := range x {
				x[i] = r.NormFloat64()
			}
		}
		do := make([]float64, len(q))
		for i := range do {
			do[i] = r.NormFloat64()
		}
		want := naiveAttention(q, k, v, a)
		var refDq []float64
		for _, tile := range [][2]int{{1, 1}, {2, 3}, {3, 2}, {7, 7}, {16, 16}} {
			a.TileQ, a.TileK = tile[0], tile[1]
			o, lse := make([]float64, len(q)), make([]float64, n*a.Heads)
			fwd(o, lse, q, k, v, a)
			for i := range o {
				if math.Abs(o[i]-want[i]) > 1e-12 {
					t.Fatalf("window %d tile %v: o[%d] = %v, naive %v", w, tile, i, o[i], want[i])
				}
			}
			dq, dk, dv := make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
			bwd(dq, dk, dv, do, q, k, v, o, lse, a)
			if refDq == nil {
				refDq = dq
				continue
			}
			for i := range dq {
				if math.Abs(dq[i]-refDq[i]) > 1e-12 {
					t.Fatalf("window %d tile %v: dq[%d] = %v, 1×1 tiles give %v", w, tile, i, dq[i], refDq[i])
				}
			}
		}
	}
}

// TestAreaMatchesKernel checks that the area recorded (Shape.Area)
// is the area moe/kernel's float32 attention executes (its Area), so the
// float32 path records what it runs.
func TestAreaMatchesKernel(t *testing.T) {
	for s := 1; s <= 20; s++ {
		for _, w := range []int{0, 1, 2, 5, 19, -1, -3, -7} { // −c: chunks of c
			for _, tile := range [][2]int{{1, 1}, {2, 3}, {4, 4}, {7, 2}, {64, 64}} {
				a := Shape{Seq: s, Window: max(w, 0), Chunk: max(-w, 0), TileQ: tile[0], TileK: tile[1]}
				if got, want := a.Area(), a.kernelShape().Area(); got != want {
					t.Errorf("s=%d w=%d tile %v: area %d, kernel %d", s, w, tile, got, want)
				}
			}
		}
	}
}

// TestValueWidthAndScale checks Forward and Backward with value heads wider
// and narrower than the q·k heads and a scale other than 1/√D (multi-head
// latent attention with YaRN's mscale), in float64 and float32: outputs
// against naiveAttention, gradients against central finite differences of
// Σ o·do in float64, and float32 against float64.
func TestValueWidthAndScale(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, dv := range []int{1, 3, 5} {
		a := Shape{Batch: 2, Seq: 5, Heads: 2, KV: 2, D: 3, DV: dv, Scale: 0.7, TileQ: 2, TileK: 3}
		n := a.Batch * a.Seq
		q, k, v := randn(r, n*a.Heads*a.D), randn(r, n*a.KV*a.D), randn(r, n*a.KV*dv)
		do := randn(r, n*a.Heads*dv)
		o, lse := make([]float64, n*a.Heads*dv), make([]float64, n*a.Heads)
		Forward(o, lse, q, k, v, a)
		want := naiveAttention(q, k, v, a)
		for i := range o {
			if math.Abs(o[i]-want[i]) > 1e-12 {
				t.Fatalf("dv %d: o[%d] = %v, naive %v", dv, i, o[i], want[i])
			}
		}
		dq, dk, dvv := make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
		Backward(dq, dk, dvv, do, q, k, v, o, lse, a)
		loss := func() float64 {
			var s float64
			for i, x := range naiveAttention(q, k, v, a) {
				s += x * do[i]
			}
			return s
		}
		for _, c := range []struct {
			x, g []float64
			name string
		}{{q, dq, "q"}, {k, dk, "k"}, {v, dvv, "v"}} {
			for i := range c.x {
				x0 := c.x[i]
				c.x[i] = x0 + 1e-6
				up := loss()
				c.x[i] = x0 - 1e-6
				dn := loss()
				c.x[i] = x0
				if fd := (up - dn) / 2e-6; math.Abs(fd-c.g[i]) > 1e-6 {
					t.Fatalf("dv %d: d%s[%d] = %v, finite difference %v", dv, c.name, i, c.g[i], fd)
				}
			}
		}
		f := func(x []float64) []float32 {
			y := make([]float32, len(x))
			for i, v := range x {
				y[i] = float32(v)
			}
			return y
		}
		o32, lse32 := make([]float32, len(o)), make([]float32, len(lse))
		Forward(o32, lse32, f(q), f(k), f(v), a)
		dq32 := make([]float32, len(q))
		Backward(dq32, make([]float32, len(k)), make([]float32, len(v)), f(do), f(q), f(k), f(v), o32, lse32, a)
		for i := range o {
			if math.Abs(float64(o32[i])-o[i]) > 1e-5 {
				t.Fatalf("dv %d: float32 o[%d] = %v, float64 %v", dv, i, o32[i], o[i])
			}
		}
		for i := range dq {
			if math.Abs(float64(dq32[i])-dq[i]) > 1e-4 {
				t.Fatalf("dv %d: float32 dq[%d] = %v, float64 %v", dv, i, dq32[i], dq[i])
			}
		}
	}
}

func randn(r *rand.Rand, n int) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = r.NormFloat64()
	}
	return x
}
