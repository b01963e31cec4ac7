package numeric

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoadTrainCheckpoint: train_state.json is the one hand-editable file
// of a checkpoint (--resume reads it). Any content is refused with an error
// or loaded with a step in [0, maxCheckpointStep] and one loss per step;
// CheckResume then accepts or refuses it without panicking.
func FuzzLoadTrainCheckpoint(f *testing.F) {
	n := faultTrainer(f, 1, 1, 1, 1, 0)
	if _, err := n.Step(context.Background()); err != nil {
		f.Fatal(err)
	}
	good := filepath.Join(f.TempDir(), "ck")
	st := TrainState{Model: n.spec.Model.Name, Layout: n.spec.Mesh.Layout, AC: n.spec.AC.String(), LBS: 1, Seq: 4, GradAccum: 1,
		GlobalBatch: 1, AdamW: n.spec.AdamW, Losses: []float64{4.1}}
	if err := SaveTrainCheckpoint(good, false, n, st); err != nil {
		f.Fatal(err)
	}
	if _, err := LoadTrainCheckpoint(good, n.spec.Model); err != nil {
		f.Fatalf("the good checkpoint: %v", err)
	}
	ents, err := os.ReadDir(good)
	if err != nil {
		f.Fatal(err)
	}
	state, err := os.ReadFile(filepath.Join(good, trainStateFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(state)
	f.Add([]byte(`{"step": -1, "losses": []}`))
	f.Add([]byte(`{"step": 1, "losses": [NaN]}`))
	f.Add([]byte(`{"step": 4611686018427387904}`))
	f.Add([]byte(`{"step": 1, "losses": [1e308], "layout": {"gpus": -4}, "ac": "layer:0", "lbs": -1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		for _, e := range ents {
			if e.Name() == trainStateFile {
				continue
			}
			// Hard links: the tensors are the good checkpoint's, unchanged.
			if err := os.Link(filepath.Join(good, e.Name()), filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, trainStateFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		ck, err := LoadTrainCheckpoint(dir, n.spec.Model)
		if err != nil {
			return
		}
		if s := ck.State.Step; s < 0 || s > maxCheckpointStep || len(ck.State.Losses) != s {
			t.Fatalf("loaded step %d with %d losses", s, len(ck.State.Losses))
		}
		_ = ck.CheckResume(st)
	})
}
