package kernel

import (
	"math/rand/v2"
	"runtime/debug"
	"testing"
)

// TestKernelsNoAlloc: once their arenas have grown, the grouped GEMMs and
// attention allocate nothing per call.
func TestKernelsNoAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	// A garbage collection empties the sync.Pools that hold the arenas, and
	// the next call refills them: that is the pool's contract, not a
	// per-call allocation, so collections are held off while counting.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	r := rand.New(rand.NewPCG(7, 7))
	const n, k = 40, 50
	offsets := []int{0, 30, 30, 90}
	w := [][]float32{randSlice(r, n*k), randSlice(r, n*k), randSlice(r, n*k)}
	x, y, dy, dx := randSlice(r, 90*k), make([]float32, 90*n), randSlice(r, 90*n), make([]float32, 90*k)
	dw := [][]float32{make([]float32, n*k), make([]float32, n*k), make([]float32, n*k)}
	a := AttnShape{Batch: 1, Seq: 100, Heads: 4, KVHeads: 2, HeadDim: 16, TileQ: 32, TileK: 32}
	q, kk, v := randSlice(r, 100*64), randSlice(r, 100*32), randSlice(r, 100*32)
	o, lse, do := make([]float32, len(q)), make([]float32, 400), randSlice(r, len(q))
	dq, dk, dv := make([]float32, len(q)), make([]float32, len(kk)), make([]float32, len(v))
	calls := func() {
		GroupedLinear(y, x, w, offsets, n, k)
		GroupedLinearBackwardData(dx, dy, w, offsets, n, k) // accumulates: values grow, allocations do not
		GroupedLinearBackwardWeight(dw, dy, x, offsets, n, k)
		AttentionForward(o, lse, q, kk, v, a)
		AttentionBackward(dq, dk, dv, do, q, kk, v, o, lse, a)
	}
	for _, threads := range []int{1, 2} {
		prev := SetThreads(threads)
		// Warm up over several rounds: sync.Pool's Put fills the calling
		// P's private slot, which other Ps cannot steal, so under load a
		// worker that lands on another P misses until every P holds
		// arenas in its private slot and its stealable shared list.
		for range 10 {
			calls()
		}
		if allocs := testing.AllocsPerRun(10, calls); allocs > 0.5 {
			t.Errorf("threads=%d: %v allocations per round of grouped GEMMs and attention, want 0", threads, allocs)
		}
		SetThreads(prev)
	}
}
