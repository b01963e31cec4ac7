package validate

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/memory/verdict"
	"github.com/moescope/moescope/parallel/epbuffer"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/published"
)

// MemoryTable is the memory validation (issue 12): every run's predicted
// peak per GPU beside the measured one when the source measured one, and
// moescope's verdict on whether the layout fits. Every run ran, so a run
// predicted not to fit is a wrong verdict, unless its source's stated
// settings cannot be the ones it ran (published.Run.Inconsistent).
type MemoryTable struct {
	Rows []MemoryRow `json:"runs"`
	// Error summarizes the rows with an error (runs of a priced recipe
	// with a measured peak); absent without any.
	Error *Summary `json:"error,omitempty"`
	// NotFit of the Ran runs estimated are predicted not to fit; the
	// Unjudged runs whose sources are inconsistent are not among them.
	NotFit   int `json:"predicted_not_to_fit"`
	Ran      int `json:"estimated"`
	Unjudged int `json:"verdict_not_judged,omitempty"`
}

// MemoryRow is one run's line of the memory table. Sizes are GiB per GPU.
type MemoryRow struct {
	Name    string `json:"name"` // run_id, else the file's name and the run's index in it
	Model   string `json:"model"`
	GPU     string `json:"gpu"`
	GPUs    int    `json:"gpus"`
	Layout  string `json:"layout"` // [ppN×]dp_replicate×dp_shard epN[ tpN etpN][ gaN]
	AC      string `json:"ac"`
	Compile bool   `json:"compile"`
	LBS     int    `json:"lbs"`
	Seq     int    `json:"seq"`
	// Kind is what Measured and Predicted are: "reserved" (a measured
	// peak_reserved_bytes or memory_fraction, or none measured) or
	// "allocated" (a source that printed the peak allocated).
	Kind      string   `json:"kind"`
	Measured  *float64 `json:"measured_gib,omitempty"`
	Predicted float64  `json:"predicted_gib"`
	// Error is predicted / measured − 1, absent when nothing was measured
	// or when PrecisionNotModelled: the run's precision names no recipe
	// the memory model prices.
	Error                *float64 `json:"error,omitempty"`
	PrecisionNotModelled bool     `json:"precision_not_modelled,omitempty"`
	// Unmodelled is the run's framework difference moescope does not
	// model (the run's unmodelled field); such rows count in the summary.
	Unmodelled string `json:"unmodelled,omitempty"`
	Fits       bool   `json:"fits"`
	// Inconsistent is why the source's stated settings cannot have run
	// (the run's inconsistent field): Fits is not judged.
	Inconsistent string `json:"inconsistent,omitempty"`
	// Series is the run's series (seriesKey), which leave-one-series-out
	// bands hold out together.
	Series string `json:"-"`
}

// Memory estimates every run's peak and verdict and summarizes the
// errors. A run it cannot estimate (unknown model or device, a bad layout)
// is left out of the table and named in the error, which joins them all.
func Memory(runs []published.Run) (MemoryTable, error) {
	var t MemoryTable
	var errs []error
	var relErrs []float64
	for i, r := range runs {
		name := r.RunID
		if name == "" {
			name = fmt.Sprintf("%s#%d", strings.TrimSuffix(filepath.Base(r.File), ".json"), runIndex(runs, i))
		}
		row, err := memoryRow(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s (%s, %s): %w", name, r.File, r.Source, err))
			continue
		}
		row.Name = name
		if row.Inconsistent != "" {
			t.Unjudged++
		} else {
			t.Ran++
			if !row.Fits {
				t.NotFit++
			}
		}
		if row.Error != nil {
			relErrs = append(relErrs, *row.Error)
		}
		t.Rows = append(t.Rows, row)
	}
	t.Error = summarize(relErrs)
	return t, errors.Join(errs...)
}

// runIndex is run i's 0-based position within its own file.
func runIndex(runs []published.Run, i int) int {
	n := 0
	for j := 0; j < i; j++ {
		if runs[j].File == runs[i].File {
			n++
		}
	}
	return n
}

// memoryRow predicts one run's peak and verdict (the row without its name).
func memoryRow(r published.Run) (MemoryRow, error) {
	cfg, err := r.LoadModel()
	if err != nil {
		return MemoryRow{}, err
	}
	dev, cl, err := hw.Resolve(r.GPU, r.Cluster)
	if err != nil {
		return MemoryRow{}, err
	}
	l := r.Layout
	rep, err := memory.Estimate(cfg, l, memory.Batch{LBS: r.LBS, Seq: r.Seq, GradAccum: r.GradAccum}, memory.OptionsOf(r.Recipe, r.AC))
	if err != nil {
		return MemoryRow{}, err
	}
	es := r.Spec
	es.Model = cfg
	outside, err := epbuffer.Outside(dev, es, cl.NVLinkDomain)
	if err != nil {
		return MemoryRow{}, err
	}
	fit := verdict.Judge(rep.Peak.Reserved, outside, dev.MemoryBytes, verdict.DefaultMemoryTarget)
	row := MemoryRow{Model: strings.TrimSuffix(filepath.Base(r.Model), ".json"), GPU: r.GPU, GPUs: r.GPUs, Layout: memoryLayout(r),
		AC: r.AC.String(), Compile: r.Compile, LBS: r.LBS, Seq: r.Seq, Unmodelled: r.Unmodelled, Inconsistent: r.Inconsistent, Fits: fit.Fits,
		Kind: "reserved", Predicted: gib(float64(rep.Peak.Reserved)), Series: seriesKey(r)}
	meas, pred, measured := 0.0, 0.0, false
	if m, ok := r.MeasuredReserved(dev); ok {
		meas, pred, measured = m, float64(rep.Peak.Reserved), true
	} else if r.PeakAllocatedBytes != nil {
		meas, pred, measured = float64(*r.PeakAllocatedBytes), float64(rep.Peak.Allocated), true
		row.Kind, row.Predicted = "allocated", gib(pred)
	}
	if measured {
		m := gib(meas)
		row.Measured = &m
		if p, err := r.PrecisionRecipe(); err == nil && p.Check("precision") == nil {
			// A priced low-precision recipe's memory is bf16's
			// (docs/precision.md: torchao saves the bf16 operands).
			e := pred/meas - 1
			row.Error = &e
		} else {
			row.PrecisionNotModelled = true
		}
	}
	return row, nil
}

// gib is n bytes in GiB.
func gib(n float64) float64 { return n / (1 << 30) }

// memoryLayout prints a run's layout with its expert, tensor and pipeline
// degrees and its micro-steps.
func memoryLayout(r published.Run) string {
	l := r.Layout
	s := fmt.Sprintf("%d×%d ep%d", l.DPReplicate, l.DPShard, l.EP)
	if l.Stages() > 1 {
		s = fmt.Sprintf("pp%d×", l.PP) + s
	}
	if l.TPDegree() > 1 {
		s += fmt.Sprintf(" tp%d etp%d", l.TPDegree(), l.ETP)
	}
	if max(1, r.GradAccum) > 1 {
		s += fmt.Sprintf(" ga%d", r.GradAccum)
	}
	return s
}
