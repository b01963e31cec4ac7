package ref

import (
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/moescope/moescope/moe"
)

// scratchBlock is a float32 MoE block of T = 128 tokens of width D = 256
// (the shape of BenchmarkForwardBackward's layers) with its weights,
// gradients, an input and an output gradient.
func scratchBlock(t *testing.T, ac moe.AC) (b *Block[float32], w, g *LayerWeights[float32], x, dy []float32) {
	c := smallMoE("scratch", 64, 1)
	m, err := NewModel[float32](c)
	if err != nil {
		t.Fatal(err)
	}
	m.InitRandom(3)
	wv, _ := layerViews(c, m.Params, m.Tensors())
	gv, _ := layerViews(c, m.Params, m.Grads())
	r := rand.New(rand.NewPCG(4, 5))
	x, dy = make([]float32, 128*c.Hidden), make([]float32, 128*c.Hidden)
	for i := range x {
		x[i], dy[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
	}
	return NewBlock[float32](c, 0, 1, 128, Options{AC: ac}), &wv.layers[0], &gv.layers[0], x, dy
}

// TestBlockStepAllocs checks a block's steps after the first allocate little
// more than what escapes to the caller: Forward's output and Backward's dx, T·D
// float32 each, 2·128·256·4 B = 256 KiB. The rest is bounded by 64 KiB:
// the routing (scores T·E, weights, values, indices and order T·K, of 4 B:
// 4 KiB + 4·1 KiB), the counts and the rows-by-token inversions (T·K int32,
// 1 KiB each) and the grouped GEMMs' per-call expert lists, closures and
// records, each under a kilobyte. Made afresh, the step's buffers come to
// over 4 MiB (h1, x2, h2, q, k, v, o, dh1, dh2, … of T·D and the experts'
// T·K·F): the bound fails without the recycling. moe/kernel's GEMM and
// attention scratch lives in per-core sync.Pool arenas, which a step run
// from another core finds empty and grows again: the test takes the least
// of four steps, and checks the bytes only without the race detector (its
// sync.Pool drops items at random); the lease's own count of buffers it had
// to make is checked either way.
func TestBlockStepAllocs(t *testing.T) {
	for _, ac := range []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACFull}, {Mode: moe.ACSelective}} {
		b, w, g, x, dy := scratchBlock(t, ac)
		b.Forward(w, x)
		b.Backward(w, g, dy, nil)
		// The same shapes again: every buffer the block leases is one the
		// first step released (this holds under the race detector too).
		made := b.scratch.Made()
		b.Forward(w, x)
		b.Backward(w, g, dy, nil)
		if d := b.scratch.Made() - made; d != 0 {
			t.Errorf("%s: a second step made %d new buffers, want 0 (the first step released buffers of every length it needs)", ac, d)
		}
		if raceEnabled {
			continue // sync.Pool drops items at random: byte counts mean nothing
		}
		least := uint64(math.MaxUint64)
		for range 4 {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			b.Forward(w, x)
			b.Backward(w, g, dy, nil)
			runtime.ReadMemStats(&after)
			least = min(least, after.TotalAlloc-before.TotalAlloc)
		}
		const escape, rest = 2 * 128 * 256 * 4, 64 << 10
		if least > escape+rest {
			t.Errorf("%s: a step after the first allocated at least %d B, want at most %d (output and dx) + %d", ac, least, escape, rest)
		}
	}
}

// TestBlockOutputSurvivesNextStep checks recycling never hands out what
// escaped: the output of a first Forward, and the dx of its Backward, keep
// their values through a second Forward (without a Backward between, as
// tests and inference do) and a further Forward+Backward.
func TestBlockOutputSurvivesNextStep(t *testing.T) {
	b, w, g, x, dy := scratchBlock(t, moe.AC{Mode: moe.ACNone})
	out1 := b.Forward(w, x)
	keep := slices.Clone(out1)
	x2 := slices.Clone(x)
	for i := range x2 {
		x2[i] = -x2[i]
	}
	b.Forward(w, x2)
	dx := b.Backward(w, g, dy, nil)
	keepDx := slices.Clone(dx)
	b.Forward(w, x)
	b.Backward(w, g, dy, nil)
	if !slices.Equal(out1, keep) {
		t.Error("a second Forward+Backward changed the first Forward's output")
	}
	if !slices.Equal(dx, keepDx) {
		t.Error("a further Forward+Backward changed the returned dx")
	}
}
