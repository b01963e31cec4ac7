package numeric

import (
	"context"
	"io"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/moe/safetensors"
	"github.com/moescope/moescope/parallel"
)

// TestResumeRefusesNonFiniteState: a checkpoint whose weights or first
// moments hold NaN or ±Inf, or whose second moments are negative, is
// refused on load naming the tensor (it used to resume into `loss NaN`).
func TestResumeRefusesNonFiniteState(t *testing.T) {
	cfg := moetest.TinyMoE()
	_, _, n := numericRun(t, cfg, moetest.FSDPLayout(t, 1, 1, 1), moe.AC{Mode: moe.ACNone}, 1, 1, 1)
	dir := filepath.Join(t.TempDir(), "ck")
	st := TrainState{Model: cfg.Name, Losses: []float64{1}}
	if err := SaveTrainCheckpoint(dir, false, n, st); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTrainCheckpoint(dir, cfg); err != nil {
		t.Fatalf("a good checkpoint: %v", err)
	}
	ps := cfg.Params()
	for _, c := range []struct {
		file, tensor string
		value        float32
		want         string
	}{
		{"model-00001-of-00001.safetensors", ps[1].Name, float32(math.NaN()), ps[1].Name + " holds NaN"},
		{"optimizer-00001-of-00001.safetensors", ps[1].Name + ".exp_avg", float32(math.Inf(1)), ps[1].Name + ".exp_avg holds +Inf"},
		{"optimizer-00001-of-00001.safetensors", ps[1].Name + ".exp_avg_sq", -1, ps[1].Name + ".exp_avg_sq holds -1 at element 0: must be finite and ≥ 0"},
	} {
		bad := filepath.Join(t.TempDir(), "ck")
		if err := SaveTrainCheckpoint(bad, false, n, st); err != nil {
			t.Fatal(err)
		}
		corrupt(t, filepath.Join(bad, c.file), c.tensor, c.value)
		if _, err := LoadTrainCheckpoint(bad, cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s = %v: %v, want %q", c.tensor, c.value, err, c.want)
		}
	}
}

// corrupt rewrites one element of tensor in the safetensors file path.
func corrupt(t *testing.T, path, tensor string, v float32) {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var ts []safetensors.NamedTensor
	for _, info := range f.Tensors() {
		data, err := f.ReadFloat32(info.Name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Name == tensor {
			data[0] = v
		}
		ts = append(ts, safetensors.NamedTensor{Name: info.Name, Shape: info.Shape, Data: data})
	}
	f.Close()
	if err := fileio.WriteFileAtomic(path, true, func(w io.Writer) error { return safetensors.Write(w, ts, "F32") }); err != nil {
		t.Fatal(err)
	}
}

// TestDivergedStepIsAnError: a step whose loss is not finite (here from a
// learning rate of 1e30) is an error naming the step, not a result.
func TestDivergedStepIsAnError(t *testing.T) {
	cfg := moetest.TinyMoE()
	m, err := ref.NewModel[float32](cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.InitRandom(1)
	mesh, err := parallel.NewMesh(moetest.FSDPLayout(t, 1, 1, 1), cfg, 8)
	if err != nil {
		t.Fatal(err)
	}
	spec := Spec{Spec: job.Spec{Model: cfg, AC: moe.AC{Mode: moe.ACNone}, Batch: job.Batch{LBS: 1, Seq: 4, GradAccum: 1}}, Mesh: mesh, AdamW: ref.AdamW{LR: 1e30, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}}
	n, err := New(spec, m.Tensors())
	if err != nil {
		t.Fatal(err)
	}
	for s := 1; s <= 3; s++ {
		if _, err := n.Step(context.Background()); err != nil {
			if !strings.Contains(err.Error(), "training diverged") {
				t.Fatalf("step %d: %v", s, err)
			}
			return
		}
	}
	t.Fatal("three steps at lr 1e30 stayed finite")
}
