package memory

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/moetest"
)

// liveBefore sums the requested bytes per category of the events before
// the first one of micro-step m's forward (no allocator rounding).
func liveBefore(t *testing.T, evs []Event, m int) map[Category]int64 {
	t.Helper()
	live := map[Category]int64{}
	for _, e := range evs {
		if e.Phase == Forward && e.Micro == m {
			return live
		}
		live[e.Category] += e.Delta()
	}
	t.Fatalf("no forward of micro-step %d", m)
	return nil
}

// TestGradSyncLastOnlyBytes: under grad-sync-last-only the unsharded
// gradients of every unit stay live between micro-steps, in the reduce
// type, and nothing is reduced before the last micro-step.
//
// Hand count of moetest.TinyMoE (V 32, D 8, 2 layers, H 2 × d 4, G 1, E 4
// experts of F 6, untied head) at ep 1, where a rank's local elements are
// whole units: embedding V·D = 256; per layer the dense unit 248 (norms
// 8 + 8, q 8·8 = 64, k and v 4·8 = 32 each, o 64, q/k norms 4 + 4, router
// 4·8 = 32) and the experts 4·3·6·8 = 576; head norm 8 + V·D 256 = 264.
// Ψ = 256 + 2·(248 + 576) + 264 = 2168 elements. Every dim 0 is even, so
// over dp_shard 2 each rank's shard is Ψ/2 = 1084 elements.
func TestGradSyncLastOnlyBytes(t *testing.T) {
	cfg := moetest.TinyMoE()
	const psi, shard = 2168, 1084
	b := Batch{LBS: 2, Seq: 4, GradAccum: 3}
	for _, tc := range []struct {
		name   string
		reduce moe.DType
		accum  int64 // accumulated bytes between micro-steps
	}{
		// Default precision: bf16 compute, fp32 reduce: FSDP2 upcasts
		// autograd's bf16 gradient into an fp32 accumulator, 4 B each.
		{"reduce f32", "", psi * 4},
		// Reduce type = compute type: autograd's bf16 gradient itself is
		// kept, 2 B each.
		{"reduce bf16", moe.BF16, psi * 2},
	} {
		l := moetest.FSDPLayout(t, 2, 1, 1)
		o := Options{AC: moe.AC{Mode: moe.ACFull}, ReduceDType: tc.reduce}
		sync, err := Estimate(cfg, l, b, o)
		if err != nil {
			t.Fatal(err)
		}
		l.GradSyncLastOnly = true
		last, err := Estimate(cfg, l, b, o)
		if err != nil {
			t.Fatal(err)
		}
		for m := 1; m < b.GradAccum; m++ {
			got := liveBefore(t, last.Events, m)
			if got[CatUnshardGrad] != tc.accum || got[CatGrads] != 0 || got[CatComm] != 0 {
				t.Errorf("%s, before micro-step %d: unsharded grads %d B (want %d), reduced %d B (want 0), comm %d B (want 0)",
					tc.name, m, got[CatUnshardGrad], tc.accum, got[CatGrads], got[CatComm])
			}
			// Syncing every micro-step keeps only the reduced fp32 shard
			// (Precision.Grad): 1084 × 4 B.
			ref := liveBefore(t, sync.Events, m)
			if ref[CatUnshardGrad] != 0 || ref[CatGrads] != shard*4 {
				t.Errorf("%s, before micro-step %d, syncing: unsharded %d B (want 0), reduced %d B (want %d)",
					tc.name, m, ref[CatUnshardGrad], ref[CatGrads], shard*4)
			}
			// Everything else between micro-steps (parameters, optimizer)
			// is the same.
			for _, c := range []Category{CatParams, CatOptimizer, CatWeights, CatActivations, CatLoss, CatWorkspace} {
				if got[c] != ref[c] {
					t.Errorf("%s, before micro-step %d: %s %d B, syncing %d B", tc.name, m, c, got[c], ref[c])
				}
			}
		}
		// After the last micro-step the reduced gradients are the same
		// shard as when syncing, and no unsharded gradient is left.
		end := func(evs []Event) map[Category]int64 {
			live := map[Category]int64{}
			for _, e := range evs {
				if e.Phase == Optimizer {
					break
				}
				live[e.Category] += e.Delta()
			}
			return live
		}
		if g, r := end(last.Events), end(sync.Events); g[CatGrads] != shard*4 || r[CatGrads] != shard*4 || g[CatUnshardGrad] != 0 {
			t.Errorf("%s, step end: reduced %d B (syncing %d B, want %d), unsharded %d B (want 0)",
				tc.name, g[CatGrads], r[CatGrads], shard*4, g[CatUnshardGrad])
		}
	}
	// Without accumulation there is nothing to defer: the same timeline.
	l := moetest.FSDPLayout(t, 2, 1, 1)
	one := Batch{LBS: 2, Seq: 4, GradAccum: 1}
	a, err := Estimate(cfg, l, one, Options{})
	if err != nil {
		t.Fatal(err)
	}
	l.GradSyncLastOnly = true
	c, err := Estimate(cfg, l, one, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Events) != len(c.Events) || a.Peak.Allocated != c.Peak.Allocated {
		t.Errorf("grad-accum 1: %d events, peak %d B with grad-sync-last-only; %d, %d B without", len(c.Events), c.Peak.Allocated, len(a.Events), a.Peak.Allocated)
	}
}
