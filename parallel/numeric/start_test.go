package numeric

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
)

// TestStart: a fresh Start from seed 7 runs the steps numericRun runs; a
// Start from the checkpoint of its first step continues at step 1 with
// that step's loss in its state and takes the uninterrupted second step
// bit for bit; a state the checkpoint cannot continue is refused.
func TestStart(t *testing.T) {
	cfg := moetest.TinyMoE()
	l := moetest.FSDPLayout(t, 2, 1, 1)
	ac := moe.AC{Mode: moe.ACNone}
	want, _, _ := numericRun(t, cfg, l, ac, 1, 1, 2)
	m, err := parallel.NewMesh(l, cfg, 4)
	if err != nil {
		t.Fatal(err)
	}
	spec := Spec{Spec: job.Spec{Model: cfg, AC: ac, Batch: job.Batch{LBS: 1, Seq: 4, GradAccum: 1}}, Mesh: m,
		DataSeed: 11, AdamW: ref.AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1},
		AuxCoef: cfg.AuxLossCoef, BiasRate: 1e-3}
	state := TrainState{Model: cfg.Name, Layout: l, LBS: 1, Seq: 4, GradAccum: 1, GlobalBatch: spec.data().Global(),
		DataSeed: spec.DataSeed, AdamW: spec.AdamW, AuxCoef: spec.AuxCoef, BiasRate: spec.BiasRate}
	n, st, err := Start(spec, state, 7, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := n.Step(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r.Loss != want[0].Loss {
		t.Fatalf("fresh start: step 1 loss %.17g, want %.17g", r.Loss, want[0].Loss)
	}
	st.Losses = append(st.Losses, r.Loss)
	dir := filepath.Join(t.TempDir(), "ck")
	if err := SaveTrainCheckpoint(dir, false, n, st); err != nil {
		t.Fatal(err)
	}
	n, st, err = Start(spec, state, 7, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n.StepIndex() != 1 || len(st.Losses) != 1 || st.Losses[0] != want[0].Loss {
		t.Fatalf("resumed at step %d with losses %v, want step 1 with [%.17g]", n.StepIndex(), st.Losses, want[0].Loss)
	}
	if r, err = n.Step(context.Background()); err != nil || r.Loss != want[1].Loss {
		t.Errorf("resumed step 2: loss %.17g (%v), want %.17g", r.Loss, err, want[1].Loss)
	}
	other := state
	other.DataSeed++
	if _, _, err := Start(spec, other, 7, dir, nil); err == nil || !strings.Contains(err.Error(), "seed 11, this run 12") {
		t.Errorf("another data seed: %v, want the checkpoint refused", err)
	}
}
