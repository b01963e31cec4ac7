package numeric

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/moe/safetensors"
)

// A training checkpoint is a directory:
//
//	model.safetensors.index.json         weights by Hugging Face name (F32), as
//	model-0000i-of-0000n.safetensors     transformers shards them (moe.LoadParams reads it)
//	optimizer-0000i-of-0000n.safetensors AdamW moments, "<name>.exp_avg" and "<name>.exp_avg_sq"
//	train_state.json                     TrainState
//	.moescope-checkpoint                 CheckpointMarker: moescope wrote this directory
//
// Shard file i holds the tensors owned by rank i's share of the parameter
// list (the list cut into n = min(world, tensors) contiguous runs), so each
// file is what one rank would write. Tensors are whole: a checkpoint loads
// into any layout (resharded on load). The directory is written under a
// temporary name in the same parent and renamed into place, so a reader
// never sees a partial checkpoint; --force replaces only a directory that
// holds the marker (fileio.ReplaceDir), after the new one is complete.

// TrainState is what a run needs besides tensors to continue exactly.
type TrainState struct {
	Model     string     `json:"model"`
	Step      int        `json:"step"` // optimizer steps taken
	Layout    job.Layout `json:"layout"`
	AC        string     `json:"ac"`
	LBS       int        `json:"lbs"`
	Seq       int        `json:"seq"`
	GradAccum int        `json:"grad_accum"`
	// GlobalBatch = lbs × dp × grad_accum sequences; a resumed run must use
	// the same, so that step t reads the same sequences.
	GlobalBatch int64     `json:"global_batch"`
	DataSeed    uint64    `json:"data_seed"`
	AdamW       ref.AdamW `json:"adamw"`
	AuxCoef     float64   `json:"aux_coef"`
	BiasRate    float64   `json:"bias_rate"`
	Losses      []float64 `json:"losses"` // one per step so far
}

const trainStateFile = "train_state.json"

// CheckpointMarker is the file that marks a directory as a checkpoint
// moescope wrote, the only kind --force may replace.
const CheckpointMarker = ".moescope-checkpoint"

// maxTrainStateBytes bounds train_state.json: its losses, one per step up
// to maxCheckpointStep, take about 25 bytes each.
const maxTrainStateBytes = 256 << 20

// maxCheckpointStep bounds a checkpoint's step count: with a global batch
// of at most 2^40 sequences (Batch.Validate), step·B stays below 2^62.
const maxCheckpointStep = 1 << 22

// SaveTrainCheckpoint writes n's parameters, optimizer state and st into
// dir, which must not exist unless force.
func SaveTrainCheckpoint(dir string, force bool, n *Trainer, st TrainState) error {
	if _, err := os.Lstat(dir); err == nil {
		if !force {
			return fmt.Errorf("%s: %w", dir, fileio.ErrExists)
		}
		if err := fileio.CheckReplaceDir(dir, CheckpointMarker); err != nil {
			return err
		}
	}
	parent := filepath.Dir(filepath.Clean(dir))
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	cfg := n.spec.Model
	ps := cfg.Params()
	params := n.Params()
	m, v, step := n.OptimizerState()
	st.Step = int(step)
	files := min(len(n.ranks), len(ps))
	weightMap := map[string]string{}
	for f := 0; f < files; f++ {
		lo, hi := f*len(ps)/files, (f+1)*len(ps)/files
		var wts, opt []safetensors.NamedTensor
		for i := lo; i < hi; i++ {
			wts = append(wts, safetensors.NamedTensor{Name: ps[i].Name, Shape: ps[i].Shape, Data: params[i]})
			if !ps[i].Buffer {
				opt = append(opt, safetensors.NamedTensor{Name: ps[i].Name + ".exp_avg", Shape: ps[i].Shape, Data: m[i]},
					safetensors.NamedTensor{Name: ps[i].Name + ".exp_avg_sq", Shape: ps[i].Shape, Data: v[i]})
			}
		}
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", f+1, files)
		for _, t := range wts {
			weightMap[t.Name] = name
		}
		if err := writeTensors(filepath.Join(tmp, name), wts); err != nil {
			return err
		}
		if err := writeTensors(filepath.Join(tmp, fmt.Sprintf("optimizer-%05d-of-%05d.safetensors", f+1, files)), opt); err != nil {
			return err
		}
	}
	idx, err := json.MarshalIndent(map[string]any{"metadata": map[string]any{"format": "pt"}, "weight_map": weightMap}, "", " ")
	if err != nil {
		return err
	}
	if err := writeBytes(filepath.Join(tmp, hf.IndexFile), idx); err != nil {
		return err
	}
	sb, err := json.MarshalIndent(st, "", " ")
	if err != nil {
		return err
	}
	if err := writeBytes(filepath.Join(tmp, trainStateFile), sb); err != nil {
		return err
	}
	if err := writeBytes(filepath.Join(tmp, CheckpointMarker), []byte("written by moescope train")); err != nil {
		return err
	}
	return fileio.ReplaceDir(tmp, dir, CheckpointMarker, force)
}

func writeTensors(path string, ts []safetensors.NamedTensor) error {
	return fileio.WriteFileAtomic(path, false, func(w io.Writer) error { return safetensors.Write(w, ts, "F32") })
}

func writeBytes(path string, b []byte) error {
	return fileio.WriteFileAtomic(path, false, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

// TrainCheckpoint is a loaded checkpoint: whole tensors in Params order.
type TrainCheckpoint struct {
	State  TrainState
	Params [][]float32
	M, V   [][]float32
}

// LoadTrainCheckpoint reads a checkpoint written by SaveTrainCheckpoint for cfg.
func LoadTrainCheckpoint(dir string, cfg *moe.Config) (*TrainCheckpoint, error) {
	b, err := fileio.ReadBounded(filepath.Join(dir, trainStateFile), maxTrainStateBytes)
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	var st TrainState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("resume: %s: %w", trainStateFile, err)
	}
	// The step indexes the data (step t reads sequences from t·B) and the
	// optimizer's bias correction; the losses are one per step taken.
	if st.Step < 0 || st.Step > maxCheckpointStep {
		return nil, fmt.Errorf("resume: %s: step = %d: must be in [0, %d]", trainStateFile, st.Step, maxCheckpointStep)
	}
	if len(st.Losses) != st.Step {
		return nil, fmt.Errorf("resume: %s: %d losses for step = %d: want one per step taken", trainStateFile, len(st.Losses), st.Step)
	}
	params, err := hf.LoadParams[float32](filepath.Join(dir, hf.IndexFile), cfg)
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	ps := cfg.Params()
	m, v := make([][]float32, len(ps)), make([][]float32, len(ps))
	want := map[string]int{}
	for i, p := range ps {
		if !p.Buffer {
			want[p.Name+".exp_avg"] = i
			want[p.Name+".exp_avg_sq"] = i
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "optimizer-*.safetensors"))
	for _, f := range files {
		sf, err := safetensors.Open(f)
		if err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
		for _, t := range sf.Tensors() {
			i, ok := want[t.Name]
			if !ok {
				sf.Close()
				return nil, fmt.Errorf("resume: %s holds %q, not an optimizer moment of this model", f, t.Name)
			}
			data, err := sf.ReadFloat32(t.Name)
			if err != nil {
				sf.Close()
				return nil, fmt.Errorf("resume: %w", err)
			}
			if int64(len(data)) != ps[i].Elements() {
				sf.Close()
				return nil, fmt.Errorf("resume: %s: %q has %d elements, want %d", f, t.Name, len(data), ps[i].Elements())
			}
			if strings.HasSuffix(t.Name, ".exp_avg_sq") {
				v[i] = data
			} else {
				m[i] = data
			}
		}
		sf.Close()
	}
	for i, p := range ps {
		if !p.Buffer && (m[i] == nil || v[i] == nil) {
			return nil, fmt.Errorf("resume: optimizer state of %s is missing", p.Name)
		}
		if err := checkState(p.Name, params[i], m[i], v[i]); err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
	}
	return &TrainCheckpoint{State: st, Params: params, M: m, V: v}, nil
}

// checkState refuses a tensor a run cannot continue from: a non-finite
// weight or first moment, or a second moment (exp_avg_sq, a running mean
// of squares) that is negative or non-finite. Such a checkpoint used to
// resume into `loss NaN`, and then failed to print or save the result.
func checkState(name string, w, m, v []float32) error {
	for _, t := range []struct {
		suffix string
		x      []float32
		minV   float64
	}{{"", w, math.Inf(-1)}, {".exp_avg", m, math.Inf(-1)}, {".exp_avg_sq", v, 0}} {
		for j, x := range t.x {
			if f := float64(x); math.IsNaN(f) || math.IsInf(f, 0) || f < t.minV {
				allowed := "must be finite"
				if t.minV == 0 {
					allowed = "must be finite and ≥ 0"
				}
				return fmt.Errorf("tensor %s%s holds %v at element %d: %s", name, t.suffix, f, j, allowed)
			}
		}
	}
	return nil
}

// CheckResume reports why a checkpoint cannot continue a run with state
// want (model, sequence length, global batch, data seed and optimizer must
// agree; the layout may differ: tensors are resharded on load).
func (c *TrainCheckpoint) CheckResume(want TrainState) error {
	got := c.State
	var errs []error
	if got.Model != want.Model {
		errs = append(errs, fmt.Errorf("model %q, this run %q", got.Model, want.Model))
	}
	if got.Seq != want.Seq {
		errs = append(errs, fmt.Errorf("seq %d, this run %d", got.Seq, want.Seq))
	}
	if got.GlobalBatch != want.GlobalBatch {
		errs = append(errs, fmt.Errorf("global batch %d sequences (lbs %d × dp %d × grad-accum %d), this run %d (lbs %d × dp %d × grad-accum %d)",
			got.GlobalBatch, got.LBS, got.Layout.DP(), got.GradAccum, want.GlobalBatch, want.LBS, want.Layout.DP(), want.GradAccum))
	}
	if got.DataSeed != want.DataSeed {
		errs = append(errs, fmt.Errorf("seed %d, this run %d", got.DataSeed, want.DataSeed))
	}
	if got.AdamW != want.AdamW || got.AuxCoef != want.AuxCoef || got.BiasRate != want.BiasRate {
		errs = append(errs, fmt.Errorf("optimizer/loss settings differ (%+v aux %g bias %g; this run %+v aux %g bias %g)",
			got.AdamW, got.AuxCoef, got.BiasRate, want.AdamW, want.AuxCoef, want.BiasRate))
	}
	if len(errs) > 0 {
		return fmt.Errorf("resume: the checkpoint cannot continue this run: %w", errors.Join(errs...))
	}
	return nil
}
