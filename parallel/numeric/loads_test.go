package numeric

import (
	"context"
	"testing"

	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
)

// TestExpertLoads: after two steps of 4 ranks × 2 micro-steps × 1 sequence
// of 4 tokens, every MoE layer of TinyMoE (2 layers, top-2) has routed, by
// hand, 2 · 4 · 2 · 4 · 2 = 128 (token, slot) rows in all.
func TestExpertLoads(t *testing.T) {
	cfg := moetest.TinyMoE()
	m, err := parallel.NewMesh(moetest.FSDPLayout(t, 4, 1, 2), cfg, 4)
	if err != nil {
		t.Fatal(err)
	}
	init, _ := ref.NewModel[float32](cfg)
	init.InitRandom(2)
	n, err := New(Spec{Spec: job.Spec{Model: cfg, Batch: job.Batch{LBS: 1, Seq: 4, GradAccum: 2}}, Mesh: m, AdamW: ref.DefaultAdamW}, init.Tensors())
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := n.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	loads := n.ExpertLoads()
	if len(loads) != 2 {
		t.Fatalf("%d MoE layers, want 2", len(loads))
	}
	for k, row := range loads {
		var sum int64
		for _, c := range row {
			sum += c
		}
		if len(row) != cfg.Experts || sum != 128 {
			t.Errorf("layer %d: %v (sum %d), want %d experts summing to 128", k, row, sum, cfg.Experts)
		}
	}
}
