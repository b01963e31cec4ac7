package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/parallel/hw"
	"gonum.org/v1/gonum/optimize"
)

// Calibration holds named model parameters fitted to measured runs. A zero
// field keeps the model's default. Compute multipliers scale the default
// efficiencies of their op class (1 = unchanged).
type Calibration struct {
	Source string `json:"source,omitempty"`
	// GEMMScale, GroupedScale, AttentionScale, MemoryBoundScale multiply the
	// modelled efficiency of dense GEMMs, grouped expert GEMMs, flash
	// attention and memory-bound ops.
	GEMMScale        float64 `json:"gemm_scale,omitempty"`
	GroupedScale     float64 `json:"grouped_scale,omitempty"`
	AttentionScale   float64 `json:"attention_scale,omitempty"`
	MemoryBoundScale float64 `json:"memory_bound_scale,omitempty"`
	// NVLinkEfficiency and NetEfficiency replace the cluster's bus-bandwidth
	// efficiencies when set.
	NVLinkEfficiency float64 `json:"nvlink_efficiency,omitempty"`
	NetEfficiency    float64 `json:"net_efficiency,omitempty"`
	// AllocatorOverhead replaces the memory allocator model's fragmentation
	// fraction (reserved = (1 + f)·compute pool + comm pool) when set.
	AllocatorOverhead float64 `json:"allocator_overhead,omitempty"`
	// Fitted names the parameters the fit moved; Kept those it could not
	// identify from the runs and left at their defaults.
	Fitted []string `json:"fitted,omitempty"`
	Kept   []string `json:"kept_default,omitempty"`
	// Residuals are relative TPS errors (predicted/measured − 1) after the
	// fit, one per run in input order; MemoryResiduals the same for peak
	// reserved memory (null for runs that do not report it).
	Residuals       []float64  `json:"residuals,omitempty"`
	MemoryResiduals []*float64 `json:"memory_residuals,omitempty"`
}

func scaleOr1(v float64) float64 {
	if v > 0 {
		return v
	}
	return 1
}

// Calibration parameter names, in fit order.
const (
	CalGEMM        = "gemm_scale"
	CalGrouped     = "grouped_scale"
	CalAttention   = "attention_scale"
	CalMemoryBound = "memory_bound_scale"
	CalNVLink      = "nvlink_efficiency"
	CalNet         = "net_efficiency"
	CalAllocator   = "allocator_overhead"
)

var tpsParams = []string{CalGEMM, CalGrouped, CalAttention, CalMemoryBound, CalNVLink, CalNet}

// Validate checks every set field.
func (c *Calibration) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    float64
	}{{CalGEMM, c.GEMMScale}, {CalGrouped, c.GroupedScale}, {CalAttention, c.AttentionScale}, {CalMemoryBound, c.MemoryBoundScale}} {
		if !(f.v == 0 || f.v >= 0.01 && f.v <= 100) {
			errs = append(errs, fmt.Errorf("%s = %v: must be in [0.01, 100] (0 = default)", f.name, f.v))
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{CalNVLink, c.NVLinkEfficiency}, {CalNet, c.NetEfficiency}} {
		if !(f.v == 0 || f.v >= 0.01 && f.v <= 1) {
			errs = append(errs, fmt.Errorf("%s = %v: must be in [0.01, 1] (0 = default)", f.name, f.v))
		}
	}
	if c.AllocatorOverhead < 0 || c.AllocatorOverhead >= 1 || math.IsNaN(c.AllocatorOverhead) {
		errs = append(errs, fmt.Errorf("%s = %v: must be in [0, 1)", CalAllocator, c.AllocatorOverhead))
	}
	return errors.Join(errs...)
}

// ReadCalibration reads and validates a calibration JSON file.
func ReadCalibration(path string) (*Calibration, error) {
	data, err := fileio.ReadJSONFile(path)
	if err != nil {
		return nil, err
	}
	return ParseCalibration(data, path)
}

// ParseCalibration decodes and validates a calibration JSON document;
// unknown fields are errors. where labels errors.
func ParseCalibration(data []byte, where string) (*Calibration, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var c Calibration
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: data after the JSON object", where)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	return &c, nil
}

// InputForRun turns a measured run into the layout to simulate: its
// model (built-in name or path), device, cluster (the run's, else the
// GPU's usual one), layout, checkpointing and batch.
func InputForRun(r Run) (Input, error) {
	cfg, err := hf.Load(r.Model)
	if err != nil {
		return Input{}, err
	}
	dev, err := hw.LookupDevice(r.GPU)
	if err != nil {
		return Input{}, err
	}
	cname := r.Cluster
	if cname == "" {
		cname = hw.ClusterForGPU(dev.Name)
	}
	cl, err := hw.LoadCluster(cname)
	if err != nil {
		return Input{}, err
	}
	l, err := r.Layout()
	if err != nil {
		return Input{}, err
	}
	ac, err := moe.ParseAC(r.AC)
	if err != nil {
		return Input{}, err
	}
	return Input{Config: cfg, Layout: l, AC: ac, LBS: r.LBS, Seq: r.Seq, GradAccum: max(1, r.GradAccum), Device: dev, Cluster: cl}, nil
}

// measuredReserved returns the run's measured peak reserved bytes, if any.
func measuredReserved(r Run, dev hw.Device) (float64, bool) {
	if r.PeakReservedBytes != nil {
		return float64(*r.PeakReservedBytes), true
	}
	if r.MemoryFraction != nil {
		return *r.MemoryFraction * float64(dev.MemoryBytes), true
	}
	return 0, false
}

// calState maps the optimizer's vector onto a calibration: multipliers are
// exp(x); link efficiencies default·exp(x), capped at 1.
type calState struct {
	names    []string // fitted TPS parameters, in x order
	defaults map[string]float64
}

func (s calState) calibration(x []float64, base Calibration) *Calibration {
	c := base
	for i, n := range s.names {
		// Multipliers stay within [0.01, 100] (Validate's range).
		v := math.Max(0.01, math.Min(100, math.Exp(x[i])))
		switch n {
		case CalGEMM:
			c.GEMMScale = v
		case CalGrouped:
			c.GroupedScale = v
		case CalAttention:
			c.AttentionScale = v
		case CalMemoryBound:
			c.MemoryBoundScale = v
		case CalNVLink:
			c.NVLinkEfficiency = math.Max(0.01, math.Min(1, s.defaults[n]*v))
		case CalNet:
			c.NetEfficiency = math.Max(0.01, math.Min(1, s.defaults[n]*v))
		}
	}
	return &c
}

// Calibrate fits the named parameters to measured runs with gonum's
// Nelder–Mead: minimize Σ_runs ln²(predicted TPS / measured TPS) +
// 1e-3·Σ x², x the log-multipliers (a weak pull to the defaults that picks
// the smallest change when the runs cannot separate the parameters). A
// parameter is fitted only when it is identifiable: moving it by 10% moves
// some run's predicted TPS by at least 0.2% (a dense-only set of runs
// leaves grouped_scale alone, single-node runs leave net_efficiency alone).
// The allocator overhead is then fitted alone to the runs that report peak
// reserved memory: minimize Σ ln²(predicted/measured reserved).
func Calibrate(runs []Run) (*Calibration, error) {
	if len(runs) == 0 {
		return nil, errors.New("calibrate: no runs")
	}
	preps := make([]*simPrep, len(runs))
	for i, r := range runs {
		in, err := InputForRun(r)
		if err != nil {
			return nil, fmt.Errorf("calibrate: run %d: %w", i, err)
		}
		if preps[i], err = prepareSim(in); err != nil {
			return nil, fmt.Errorf("calibrate: run %d: %w", i, err)
		}
	}
	cl0 := preps[0].cl
	st := calState{defaults: map[string]float64{CalNVLink: cl0.NVLinkEfficiency, CalNet: cl0.NetEfficiency}}
	predict := func(c *Calibration) ([]float64, error) {
		out := make([]float64, len(preps))
		for i, p := range preps {
			r, err := p.run(c)
			if err != nil {
				return nil, err
			}
			out[i] = r.TPS
		}
		return out, nil
	}
	base, err := predict(nil)
	if err != nil {
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	cal := &Calibration{Source: fmt.Sprintf("moescope calibrate, %d run(s)", len(runs))}
	// Identifiability by sensitivity.
	for _, n := range tpsParams {
		probe := calState{names: []string{n}, defaults: st.defaults}
		moved, err := predict(probe.calibration([]float64{math.Log(1.1)}, Calibration{}))
		if err != nil {
			return nil, fmt.Errorf("calibrate: %w", err)
		}
		sens := 0.0
		for i := range moved {
			sens = math.Max(sens, math.Abs(math.Log(moved[i]/base[i])))
		}
		if sens >= 0.002 {
			st.names = append(st.names, n)
		} else {
			cal.Kept = append(cal.Kept, n)
		}
	}
	var fitErr error
	if len(st.names) > 0 {
		obj := func(x []float64) float64 {
			pred, err := predict(st.calibration(x, Calibration{}))
			if err != nil {
				fitErr = err
				return math.Inf(1)
			}
			f := 0.0
			for i, r := range runs {
				d := math.Log(pred[i] / r.TPS)
				f += d * d
			}
			for _, v := range x {
				f += 1e-3 * v * v
			}
			return f
		}
		// Stop when the objective (squared log errors) has not moved by
		// 1e-6 for 10 iterations: TPS errors then agree to ~0.1%.
		res, err := optimize.Minimize(optimize.Problem{Func: obj}, make([]float64, len(st.names)),
			&optimize.Settings{FuncEvaluations: 600, Converger: &optimize.FunctionConverge{Absolute: 1e-6, Iterations: 10}},
			&optimize.NelderMead{})
		if fitErr != nil {
			return nil, fmt.Errorf("calibrate: %w", fitErr)
		}
		if err != nil && res == nil {
			return nil, fmt.Errorf("calibrate: %w", err)
		}
		cal = st.calibration(res.X, *cal)
		cal.Fitted = append(cal.Fitted, st.names...)
	}
	// Allocator overhead from measured memory.
	var memIdx []int
	var memMeas []float64
	for i, r := range runs {
		if m, ok := measuredReserved(r, preps[i].dev); ok {
			memIdx, memMeas = append(memIdx, i), append(memMeas, m)
		}
	}
	if len(memIdx) > 0 {
		frag := func(x float64) float64 { return 0.95 / (1 + math.Exp(-x)) } // (0, 0.95)
		obj := func(x []float64) float64 {
			a := memory.DefaultAllocator
			a.Fragmentation = frag(x[0])
			f := 0.0
			for k, i := range memIdx {
				p, err := memory.Replay(preps[i].mem.Events, a)
				if err != nil {
					fitErr = err
					return math.Inf(1)
				}
				d := math.Log(float64(p.Reserved) / memMeas[k])
				f += d * d
			}
			return f
		}
		x0 := math.Log(memory.DefaultAllocator.Fragmentation / (0.95 - memory.DefaultAllocator.Fragmentation))
		res, err := optimize.Minimize(optimize.Problem{Func: obj}, []float64{x0},
			&optimize.Settings{FuncEvaluations: 200, Converger: &optimize.FunctionConverge{Absolute: 1e-10, Iterations: 20}},
			&optimize.NelderMead{})
		if fitErr != nil {
			return nil, fmt.Errorf("calibrate: %w", fitErr)
		}
		if err != nil && res == nil {
			return nil, fmt.Errorf("calibrate: %w", err)
		}
		cal.AllocatorOverhead = frag(res.X[0])
		cal.Fitted = append(cal.Fitted, CalAllocator)
	} else {
		cal.Kept = append(cal.Kept, CalAllocator)
	}
	// Residuals.
	for i, p := range preps {
		r, err := p.run(cal)
		if err != nil {
			return nil, fmt.Errorf("calibrate: %w", err)
		}
		cal.Residuals = append(cal.Residuals, r.TPS/runs[i].TPS-1)
		if m, ok := measuredReserved(runs[i], p.dev); ok {
			v := float64(r.PeakReservedBytes)/m - 1
			cal.MemoryResiduals = append(cal.MemoryResiduals, &v)
		} else {
			cal.MemoryResiduals = append(cal.MemoryResiduals, nil)
		}
	}
	return cal, cal.Validate()
}
