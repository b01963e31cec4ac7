package kernel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// visible is the mask M(i, j) stated directly (causal, and within the
// window or the query's chunk when there is one), the oracle the kernel's
// tile logic is checked against.
func visible(a AttnShape, i, j int) bool {
	return j <= i && (a.Window == 0 || j > i-a.Window) && (a.Chunk == 0 || j/a.Chunk == i/a.Chunk)
}

// attnRef is an independent float64 attention: the whole score matrix of
// each (sequence, head), a row softmax, and the textbook backward
// (dV = Pᵀ·dO, dP = dO·Vᵀ, dS_ij = P_ij·(dP_ij − Σ_l P_il·dP_il), dQ = c·dS·K,
// dK = c·dSᵀ·Q), with no tiling and no log-sum-exp trick.
func attnRef(a AttnShape, q, k, v, do []float32) (o, lse, dq, dk, dv []float64) {
	H, G, d, s := a.Heads, a.KVHeads, a.HeadDim, a.Seq
	T := a.Batch * s
	o, lse = make([]float64, T*H*d), make([]float64, T*H)
	dq, dk, dv = make([]float64, T*H*d), make([]float64, T*G*d), make([]float64, T*G*d)
	c := 1 / math.Sqrt(float64(d))
	qi := func(b, i, h, e int) int { return ((b*s+i)*H+h)*d + e }
	ki := func(b, j, g, e int) int { return ((b*s+j)*G+g)*d + e }
	for b := 0; b < a.Batch; b++ {
		for h := 0; h < H; h++ {
			g := h / (H / G)
			P := make([][]float64, s)
			for i := 0; i < s; i++ {
				P[i] = make([]float64, s)
				mx := math.Inf(-1)
				for j := 0; j < s; j++ {
					if !visible(a, i, j) {
						continue
					}
					var x float64
					for e := 0; e < d; e++ {
						x += float64(q[qi(b, i, h, e)]) * float64(k[ki(b, j, g, e)])
					}
					P[i][j] = x * c
					mx = max(mx, x*c)
				}
				var z float64
				for j := 0; j < s; j++ {
					if visible(a, i, j) {
						P[i][j] = math.Exp(P[i][j] - mx)
						z += P[i][j]
					}
				}
				lse[(b*s+i)*H+h] = mx + math.Log(z)
				for j := 0; j < s; j++ {
					P[i][j] /= z
					for e := 0; e < d; e++ {
						o[qi(b, i, h, e)] += P[i][j] * float64(v[ki(b, j, g, e)])
					}
				}
			}
			for i := 0; i < s; i++ {
				dP := make([]float64, s)
				var rowDot float64
				for j := 0; j < s; j++ {
					for e := 0; e < d; e++ {
						dP[j] += float64(do[qi(b, i, h, e)]) * float64(v[ki(b, j, g, e)])
					}
					rowDot += P[i][j] * dP[j]
				}
				for j := 0; j < s; j++ {
					ds := P[i][j] * (dP[j] - rowDot)
					for e := 0; e < d; e++ {
						dv[ki(b, j, g, e)] += P[i][j] * float64(do[qi(b, i, h, e)])
						dq[qi(b, i, h, e)] += c * ds * float64(k[ki(b, j, g, e)])
						dk[ki(b, j, g, e)] += c * ds * float64(q[qi(b, i, h, e)])
					}
				}
			}
		}
	}
	return
}

func closeTo(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	for i, w := range want {
		if d := math.Abs(float64(got[i]) - w); !(d <= tol*(1+math.Abs(w))) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], w)
		}
	}
}

func TestAttention(t *testing.T) {
	shapes := []AttnShape{
		{Batch: 1, Seq: 5, Heads: 2, KVHeads: 1, HeadDim: 4},
		{Batch: 2, Seq: 70, Heads: 4, KVHeads: 2, HeadDim: 8},
		{Batch: 1, Seq: 150, Heads: 2, KVHeads: 2, HeadDim: 16, Window: 40},
		{Batch: 1, Seq: 200, Heads: 3, KVHeads: 1, HeadDim: 5, Window: 64},
		{Batch: 1, Seq: 130, Heads: 2, KVHeads: 1, HeadDim: 32, Window: 1},
		{Batch: 1, Seq: 50, Heads: 4, KVHeads: 2, HeadDim: 8, Window: 7, TileQ: 8, TileK: 16},
		{Batch: 1, Seq: 9, Heads: 2, KVHeads: 1, HeadDim: 3, TileQ: 1, TileK: 1},
		// Query heads stacked per product (stackHeads): two stacks of two
		// heads, and three stacks of one, each with a short last tile.
		{Batch: 2, Seq: 360, Heads: 8, KVHeads: 2, HeadDim: 8, TileQ: 300, TileK: 48},
		{Batch: 1, Seq: 410, Heads: 6, KVHeads: 2, HeadDim: 8, Window: 90, TileQ: 400, TileK: 40},
		// Llama 4's chunks: tiles across chunk boundaries, a chunk of one,
		// chunks longer than a tile, and a short last chunk.
		{Batch: 2, Seq: 70, Heads: 4, KVHeads: 2, HeadDim: 8, Chunk: 12, TileQ: 8, TileK: 16},
		{Batch: 1, Seq: 9, Heads: 2, KVHeads: 1, HeadDim: 3, Chunk: 1},
		{Batch: 1, Seq: 300, Heads: 4, KVHeads: 1, HeadDim: 5, Chunk: 100, TileQ: 64, TileK: 48},
	}
	forEachPath(t, func(t *testing.T) {
		for _, a := range shapes {
			t.Run(fmt.Sprintf("%+v", a), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(a.Seq), 9))
				T := a.Batch * a.Seq
				q, k, v := randSlice(r, T*a.Heads*a.HeadDim), randSlice(r, T*a.KVHeads*a.HeadDim), randSlice(r, T*a.KVHeads*a.HeadDim)
				do := randSlice(r, T*a.Heads*a.HeadDim)
				for i := range q { // larger scores exercise the running max
					q[i] *= 3
				}
				o, lse := make([]float32, len(q)), make([]float32, T*a.Heads)
				AttentionForward(o, lse, q, k, v, a)
				wo, wlse, wdq, wdk, wdv := attnRef(a, q, k, v, do)
				closeTo(t, "o", o, wo, 1e-5)
				closeTo(t, "lse", lse, wlse, 1e-5)
				// Backward accumulates: start from 1 and subtract it.
				dq, dk, dv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
				for _, s := range [][]float32{dq, dk, dv} {
					for i := range s {
						s[i] = 1
					}
				}
				AttentionBackward(dq, dk, dv, do, q, k, v, o, lse, a)
				for _, s := range [][]float32{dq, dk, dv} {
					for i := range s {
						s[i]--
					}
				}
				closeTo(t, "dq", dq, wdq, 2e-5)
				closeTo(t, "dk", dk, wdk, 2e-5)
				closeTo(t, "dv", dv, wdv, 2e-5)
			})
		}
	})
}

// TestAttnRefGradient checks attnRef's backward formulas against central
// finite differences of L = Σ dO ⊙ O in float64.
func TestAttnRefGradient(t *testing.T) {
	a := AttnShape{Batch: 1, Seq: 6, Heads: 2, KVHeads: 1, HeadDim: 3, Window: 4}
	r := rand.New(rand.NewPCG(1, 1))
	q, k, v, do := randSlice(r, 6*2*3), randSlice(r, 6*3), randSlice(r, 6*3), randSlice(r, 6*2*3)
	loss := func() float64 {
		o, _, _, _, _ := attnRef(a, q, k, v, do)
		var l float64
		for i := range o {
			l += o[i] * float64(do[i])
		}
		return l
	}
	_, _, dq, dk, dv := attnRef(a, q, k, v, do)
	for _, c := range []struct {
		x    []float32
		grad []float64
	}{{q, dq}, {k, dk}, {v, dv}} {
		for i := range c.x {
			const h = 1e-2
			x0 := c.x[i]
			c.x[i] = x0 + h
			lp := loss()
			c.x[i] = x0 - h
			lm := loss()
			c.x[i] = x0
			if fd := (lp - lm) / (2 * h); math.Abs(fd-c.grad[i]) > 1e-3 {
				t.Fatalf("gradient %d: formula %v, finite difference %v", i, c.grad[i], fd)
			}
		}
	}
}

func TestAttentionArea(t *testing.T) {
	// Hand-derived with 64×64 tiles: full causal, s = 128 = 2 tiles: the
	// three tiles on or below the diagonal, 3·64·64 = 12288. s = 100: tiles
	// clipped to 64 and 36: 64·64 + 36·64 + 36·36 = 7696. Window 1 (only
	// j = i): the two diagonal tiles, 2·64·64 = 8192.
	for _, c := range []struct {
		seq, window int
		want        int64
	}{{128, 0, 12288}, {100, 0, 7696}, {128, 1, 8192}, {64, 0, 4096}} {
		if got := (AttnShape{Seq: c.seq, Window: c.window, TileQ: 64, TileK: 64}).Area(); got != c.want {
			t.Errorf("Area(seq %d, window %d) = %d, want %d", c.seq, c.window, got, c.want)
		}
	}
	// 1×1 tiles execute exactly the unmasked entries: s(s+1)/2 causal;
	// window w: Σ_i min(i+1, w), for s = 10, w = 4: 1+2+3+4·7 = 34.
	if got := (AttnShape{Seq: 10, TileQ: 1, TileK: 1}).Area(); got != 55 {
		t.Errorf("1×1 causal s=10: %d, want 55", got)
	}
	if got := (AttnShape{Seq: 10, Window: 4, TileQ: 1, TileK: 1}).Area(); got != 34 {
		t.Errorf("1×1 window 4 s=10: %d, want 34", got)
	}
	// Chunks of 4 over s = 10 (chunks 0–3, 4–7, 8–9), 1×1: 10 + 10 + 3 = 23.
	// Chunks of 32 over s = 128 with 64×64 tiles: each query tile sees only
	// its own key tile (its chunks lie inside it), 2·64·64 = 8192.
	if got := (AttnShape{Seq: 10, Chunk: 4, TileQ: 1, TileK: 1}).Area(); got != 23 {
		t.Errorf("1×1 chunk 4 s=10: %d, want 23", got)
	}
	if got := (AttnShape{Seq: 128, Chunk: 32, TileQ: 64, TileK: 64}).Area(); got != 8192 {
		t.Errorf("64×64 chunk 32 s=128: %d, want 8192", got)
	}
	// Brute force: a tile counts iff it holds a visible entry.
	for _, tiles := range [][2]int{{0, 0}, {16, 48}, {48, 16}} {
		for _, seq := range []int{1, 63, 64, 65, 200, 300} {
			for _, w := range []int{0, 1, 2, 63, 64, 65, 100, 500, -1, -17, -64, -100} {
				a := AttnShape{Seq: seq, Window: max(w, 0), Chunk: max(-w, 0), TileQ: tiles[0], TileK: tiles[1]}
				tq, tk := a.tiles()
				var want int64
				for i0 := 0; i0 < seq; i0 += tq {
					for j0 := 0; j0 < seq; j0 += tk {
						i1, j1 := min(i0+tq, seq), min(j0+tk, seq)
						live := false
						for i := i0; i < i1; i++ {
							for j := j0; j < j1; j++ {
								live = live || visible(a, i, j)
							}
						}
						if live {
							want += int64(i1-i0) * int64(j1-j0)
						}
					}
				}
				if got := a.Area(); got != want {
					t.Errorf("%+v: Area() = %d, brute force %d", a, got, want)
				}
			}
		}
	}
}

// FuzzAttention compares forward and backward with attnRef on small random
// shapes, windows, chunks and tile sizes.
func FuzzAttention(f *testing.F) {
	f.Add(uint8(9), uint8(2), uint8(1), uint8(3), uint8(0), uint8(4), uint8(3), uint64(1))
	f.Add(uint8(33), uint8(4), uint8(2), uint8(8), uint8(5), uint8(0), uint8(0), uint64(2))
	f.Add(uint8(1), uint8(1), uint8(1), uint8(1), uint8(1), uint8(1), uint8(1), uint64(3))
	f.Add(uint8(30), uint8(2), uint8(1), uint8(4), uint8(130), uint8(4), uint8(7), uint64(4))
	f.Fuzz(func(t *testing.T, seq, heads, kvHeads, d, window, tq, tk uint8, seed uint64) {
		g := int(kvHeads)%3 + 1
		a := AttnShape{Batch: 1, Seq: int(seq)%40 + 1, Heads: g * (int(heads)%3 + 1), KVHeads: g, HeadDim: int(d)%9 + 1,
			Window: int(window) % 12, TileQ: int(tq) % 20, TileK: int(tk) % 20}
		if window >= 128 { // the high half of window draws a chunk instead
			a.Window, a.Chunk = 0, int(window)%12+1
		}
		r := rand.New(rand.NewPCG(seed, 5))
		T := a.Seq
		q, k, v := randSlice(r, T*a.Heads*a.HeadDim), randSlice(r, T*a.KVHeads*a.HeadDim), randSlice(r, T*a.KVHeads*a.HeadDim)
		do := randSlice(r, len(q))
		o, lse := make([]float32, len(q)), make([]float32, T*a.Heads)
		AttentionForward(o, lse, q, k, v, a)
		dq, dk, dv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
		AttentionBackward(dq, dk, dv, do, q, k, v, o, lse, a)
		wo, wlse, wdq, wdk, wdv := attnRef(a, q, k, v, do)
		closeTo(t, "o", o, wo, 1e-5)
		closeTo(t, "lse", lse, wlse, 1e-5)
		closeTo(t, "dq", dq, wdq, 3e-5)
		closeTo(t, "dk", dk, wdk, 3e-5)
		closeTo(t, "dv", dv, wdv, 3e-5)
	})
}

// TestStackHeads: the stack is the largest divisor of rep within 1024 rows
// (hand-derived: 8 heads of 128 rows stack all 8 = 1024 rows; 4 of 300
// stack 2 = 600, as 4 would be 1200; 3 of 400 stack 1).
func TestStackHeads(t *testing.T) {
	for _, c := range []struct{ rep, tq, want int }{{8, 128, 8}, {16, 128, 8}, {3, 128, 3}, {4, 300, 2}, {3, 400, 1}, {1, 2000, 1}, {16, 1, 16}} {
		if got := stackHeads(c.rep, c.tq); got != c.want {
			t.Errorf("stackHeads(%d, %d) = %d, want %d", c.rep, c.tq, got, c.want)
		}
	}
}
