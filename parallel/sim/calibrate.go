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
	// Notes say why a parameter was kept when the reason is not the
	// identifiability test's (the allocator overhead's fit).
	Notes []string `json:"notes,omitempty"`
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
	mo, err := r.MemoryOptions()
	if err != nil {
		return Input{}, err
	}
	return Input{Config: cfg, Layout: l, AC: ac, LBS: r.LBS, Seq: r.Seq, GradAccum: max(1, r.GradAccum), Device: dev, Cluster: cl,
		Memory: mo}, nil
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
// reserved memory (fitAllocator: least Σ ln²(predicted/measured reserved),
// in closed form, kept at its default with a note when not identified).
func Calibrate(runs []Run) (*Calibration, error) {
	if len(runs) == 0 {
		return nil, errors.New("calibrate: no runs")
	}
	f, err := prepareFit(runs)
	if err != nil {
		return nil, err
	}
	cl0 := f.preps[0].cl
	st := calState{defaults: map[string]float64{CalNVLink: cl0.NVLinkEfficiency, CalNet: cl0.NetEfficiency}}
	cal := &Calibration{Source: fmt.Sprintf("moescope calibrate, %d run(s)", len(runs))}
	if st.names, cal.Kept, err = f.identifiable(st.defaults); err != nil {
		return nil, err
	}
	if len(st.names) > 0 {
		x, err := f.fitTPS(st)
		if err != nil {
			return nil, err
		}
		cal = st.calibration(x, *cal)
		cal.Fitted = append(cal.Fitted, st.names...)
	}
	frag, ok, why, err := f.fitAllocator()
	switch {
	case err != nil:
		return nil, err
	case ok:
		cal.AllocatorOverhead = frag
		cal.Fitted = append(cal.Fitted, CalAllocator)
	default:
		cal.Kept = append(cal.Kept, CalAllocator)
		cal.Notes = append(cal.Notes, why)
	}
	if err := f.recordResiduals(cal); err != nil {
		return nil, err
	}
	return cal, cal.Validate()
}

// calFit is what a calibration fits to: the measured runs and their
// prepared simulations, in the same order.
type calFit struct {
	runs  []Run
	preps []*simPrep
}

// prepareFit prepares every run's simulation once; the fit then only
// re-runs them under trial calibrations.
func prepareFit(runs []Run) (calFit, error) {
	f := calFit{runs: runs, preps: make([]*simPrep, len(runs))}
	for i, r := range runs {
		in, err := InputForRun(r)
		if err != nil {
			return calFit{}, fmt.Errorf("calibrate: run %d: %w", i, err)
		}
		if f.preps[i], err = prepareSim(in); err != nil {
			return calFit{}, fmt.Errorf("calibrate: run %d: %w", i, err)
		}
	}
	return f, nil
}

// predictTPS returns every run's predicted TPS under c (nil: defaults).
func (f calFit) predictTPS(c *Calibration) ([]float64, error) {
	out := make([]float64, len(f.preps))
	for i, p := range f.preps {
		r, err := p.run(c)
		if err != nil {
			return nil, err
		}
		out[i] = r.TPS
	}
	return out, nil
}

// identifiable splits the TPS parameters, in fit order, into those the
// runs can identify (moving one by 10% moves some run's predicted TPS by
// at least 0.2%) and those kept at their defaults.
func (f calFit) identifiable(defaults map[string]float64) (fit, kept []string, err error) {
	base, err := f.predictTPS(nil)
	if err != nil {
		return nil, nil, fmt.Errorf("calibrate: %w", err)
	}
	for _, n := range tpsParams {
		probe := calState{names: []string{n}, defaults: defaults}
		moved, err := f.predictTPS(probe.calibration([]float64{math.Log(1.1)}, Calibration{}))
		if err != nil {
			return nil, nil, fmt.Errorf("calibrate: %w", err)
		}
		sens := 0.0
		for i := range moved {
			sens = math.Max(sens, math.Abs(math.Log(moved[i]/base[i])))
		}
		if sens >= 0.002 {
			fit = append(fit, n)
		} else {
			kept = append(kept, n)
		}
	}
	return fit, kept, nil
}

// tpsObjective is the TPS fit's objective at x (st's log-multipliers):
// Σ_runs ln²(predicted/measured TPS) + 1e-3·Σ x².
func (f calFit) tpsObjective(st calState, x []float64) (float64, error) {
	pred, err := f.predictTPS(st.calibration(x, Calibration{}))
	if err != nil {
		return 0, err
	}
	v := 0.0
	for i, r := range f.runs {
		d := math.Log(pred[i] / r.TPS)
		v += d * d
	}
	for _, xi := range x {
		v += 1e-3 * xi * xi
	}
	return v, nil
}

// fitTPS fits st's parameters from the defaults (x = 0) and returns their
// log-multipliers.
func (f calFit) fitTPS(st calState) ([]float64, error) {
	obj := func(x []float64) (float64, error) { return f.tpsObjective(st, x) }
	// Stop when the objective (squared log errors) has not moved by
	// 1e-6 for 10 iterations: TPS errors then agree to ~0.1%.
	return nelderMead(obj, make([]float64, len(st.names)),
		&optimize.Settings{FuncEvaluations: 600, Converger: &optimize.FunctionConverge{Absolute: 1e-6, Iterations: 10}})
}

// fitAllocator fits the allocator's unmodelled fraction f to the runs that
// report peak reserved memory. Predicted reserved is S·(1+f), S the
// simulated pools, so Σ ln²(S_k·(1+f)/M_k) is least at
// ln(1+f) = mean_k ln(M_k/S_k): the fit is that closed form. It is
// identified only when f ≥ 0; a negative f would mean the runs hold less
// than the simulated pools alone (the model over-predicts their memory, an
// error no allocator overhead can repair), and the default is kept with
// why. ok is false when no run reports reserved memory or f is not
// identified.
func (f calFit) fitAllocator() (frag float64, ok bool, why string, err error) {
	a := memory.DefaultAllocator
	a.Fragmentation = 0
	sum, n := 0.0, 0
	for i, r := range f.runs {
		m, measured := measuredReserved(r, f.preps[i].dev)
		if !measured {
			continue
		}
		p, err := memory.Replay(f.preps[i].mem.Events, a, f.preps[i].in.Memory.Segments)
		if err != nil {
			return 0, false, "", err
		}
		sum += math.Log(m / float64(p.Reserved))
		n++
	}
	if n == 0 {
		return 0, false, CalAllocator + ": no run reports peak reserved memory", nil
	}
	frag = math.Expm1(sum / float64(n))
	if frag < 0 {
		return 0, false, fmt.Sprintf("%s: not identified: the %d run(s) reporting reserved memory measure %.1f%% below the simulated pools alone "+
			"(geometric mean), which no allocator overhead ≥ 0 repairs; the default is kept", CalAllocator, n, -100*frag), nil
	}
	if frag >= 0.95 {
		return 0, false, fmt.Sprintf("%s: not identified: the runs measure %.0f%% above the simulated pools, beyond any allocator overhead (< 95%%); "+
			"the default is kept", CalAllocator, 100*frag), nil
	}
	return frag, true, "", nil
}

// nelderMead minimizes obj from x0 under settings with gonum's Nelder–Mead.
// An evaluation that fails counts as +Inf to the optimizer and fails the
// fit with its error; an optimizer error fails it only when no result came
// back (the problem could not be set up), else the best point found stands.
func nelderMead(obj func([]float64) (float64, error), x0 []float64, settings *optimize.Settings) ([]float64, error) {
	var objErr error
	fn := func(x []float64) float64 {
		v, err := obj(x)
		if err != nil {
			objErr = err
			return math.Inf(1)
		}
		return v
	}
	res, err := optimize.Minimize(optimize.Problem{Func: fn}, x0, settings, &optimize.NelderMead{})
	if objErr != nil {
		return nil, fmt.Errorf("calibrate: %w", objErr)
	}
	if err != nil && res == nil {
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	return res.X, nil
}

// recordResiduals sets cal's relative TPS and peak-reserved errors, run by
// run, as the report of the fit.
func (f calFit) recordResiduals(cal *Calibration) error {
	for i, p := range f.preps {
		r, err := p.run(cal)
		if err != nil {
			return fmt.Errorf("calibrate: %w", err)
		}
		cal.Residuals = append(cal.Residuals, r.TPS/f.runs[i].TPS-1)
		if m, ok := measuredReserved(f.runs[i], p.dev); ok {
			v := float64(r.PeakReservedBytes)/m - 1
			cal.MemoryResiduals = append(cal.MemoryResiduals, &v)
		} else {
			cal.MemoryResiduals = append(cal.MemoryResiduals, nil)
		}
	}
	return nil
}
