package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/parallel/hw"
	"gonum.org/v1/gonum/mat"
)

// Calibration holds named model parameters fitted to measured runs. A zero
// field keeps the model's default. Compute multipliers scale the default
// efficiencies of their op class (1 = unchanged).
type Calibration struct {
	Source string `json:"source,omitempty"`
	// GEMMScale, GroupedScale, AttentionScale, MemoryBoundScale multiply the
	// modelled efficiency of dense GEMMs, grouped expert GEMMs, flash
	// attention and memory-bound ops.
	// ComputeScale multiplies all four compute efficiencies at once: the
	// one overall scale a single run can identify.
	ComputeScale     float64 `json:"compute_scale,omitempty"`
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
	// Covariance is the fit's covariance of the log-multipliers of
	// CovarianceParams (the fitted TPS parameters, in that order), and
	// ResidualSD the spread of ln TPS a prediction carries besides it:
	// together they give a calibrated prediction its 90% interval.
	CovarianceParams []string    `json:"covariance_params,omitempty"`
	Covariance       [][]float64 `json:"covariance,omitempty"`
	ResidualSD       float64     `json:"residual_sd,omitempty"`
}

func scaleOr1(v float64) float64 {
	if v > 0 {
		return v
	}
	return 1
}

// Calibration parameter names, in fit order.
const (
	CalCompute     = "compute_scale"
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
	}{{CalCompute, c.ComputeScale}, {CalGEMM, c.GEMMScale}, {CalGrouped, c.GroupedScale}, {CalAttention, c.AttentionScale},
		{CalMemoryBound, c.MemoryBoundScale}} {
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
	errs = append(errs, c.validateCovariance())
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
	if r.PowerLimited {
		return Input{}, fmt.Errorf("run %s: power_limited: its GPUs ran below their default power limit, which the source does not state; the time model prices %s at its default limit only", r.label(), r.GPU)
	}
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
	if err := CheckPrecision("precision", r.Precision); err != nil {
		return Input{}, err
	}
	mo, err := r.MemoryOptions()
	if err != nil {
		return Input{}, err
	}
	tv, err := ParseTorchVersion("torch_version", r.TorchVersion)
	if err != nil {
		return Input{}, err
	}
	disp, err := ParseDispatcher("dispatcher", r.Dispatcher)
	if err != nil {
		return Input{}, err
	}
	experts, err := ParseExpertGEMM("expert_gemm", r.ExpertGEMM)
	if err != nil {
		return Input{}, err
	}
	return Input{Config: cfg, Layout: l, AC: ac, LBS: r.LBS, Seq: r.Seq, GradAccum: max(1, r.GradAccum), Device: dev, Cluster: cl,
		Memory: mo, AttentionKernel: AttentionKernel(r.AttentionKernel), Precision: r.Precision, Torch: tv, FusedElementwise: r.FusedElementwise, Dispatcher: disp, ExpertGEMM: experts}, nil
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
		case CalCompute:
			c.ComputeScale = v
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

// maxCalRuns bounds how many runs one calibration reads: a sweep is a
// handful, a table of published runs a few hundred; the fit's time grows
// linearly with the count.
const maxCalRuns = 1000

// Calibrate fits the model's parameters to measured runs (calfit.go: a
// Levenberg–Marquardt fit of ln TPS with the grounded defaults as prior).
// Only what the runs can tell apart is fitted: one run fits one overall
// compute scale; several runs fit the efficiencies whose effects on the
// runs are distinct (identify), the others kept at their defaults and
// named. The fit's covariance and residual spread are kept for intervals.
// The allocator overhead is then fitted alone to the runs that report peak
// reserved memory (fitAllocator: least Σ ln²(predicted/measured reserved),
// in closed form, kept at its default with a note when not identified).
func Calibrate(runs []Run) (*Calibration, error) {
	if len(runs) == 0 {
		return nil, errors.New("calibrate: no runs")
	}
	if len(runs) > maxCalRuns {
		return nil, fmt.Errorf("calibrate: %d runs: at most %d", len(runs), maxCalRuns)
	}
	f, err := prepareFit(runs)
	if err != nil {
		return nil, err
	}
	cl0 := f.preps[0].cl
	st := calState{defaults: map[string]float64{CalNVLink: cl0.NVLinkEfficiency, CalNet: cl0.NetEfficiency}}
	cal := &Calibration{Source: fmt.Sprintf("moescope calibrate, %d run(s)", len(runs))}
	candidates := tpsParams
	if len(runs) == 1 {
		candidates = []string{CalCompute}
	}
	var J0 *mat.Dense
	var lp0 []float64
	if st.names, cal.Kept, J0, lp0, err = f.identify(candidates, st.defaults); err != nil {
		return nil, err
	}
	if len(runs) == 1 {
		cal.Kept = append(cal.Kept, tpsParams...)
	}
	if len(st.names) > 0 {
		measured := make([]float64, len(runs))
		for i, r := range runs {
			measured[i] = math.Log(r.TPS)
		}
		fr, err := f.fitTPS(st, J0, lp0, measured)
		if err != nil {
			return nil, err
		}
		cal = st.calibration(fr.x, *cal)
		cal.Fitted = append(cal.Fitted, st.names...)
		cal.CovarianceParams, cal.ResidualSD = st.names, fr.residualSD
		for a := range st.names {
			row := make([]float64, len(st.names))
			for b := range row {
				row[b] = fr.cov.At(a, b)
			}
			cal.Covariance = append(cal.Covariance, row)
		}
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
	preps []*Prepared
}

// prepareFit prepares every run's simulation once; the fit then only
// re-runs them under trial calibrations.
func prepareFit(runs []Run) (calFit, error) {
	f := calFit{runs: runs, preps: make([]*Prepared, len(runs))}
	for i, r := range runs {
		in, err := InputForRun(r)
		if err != nil {
			return calFit{}, fmt.Errorf("calibrate: run %d: %w", i, err)
		}
		if f.preps[i], err = Prepare(in); err != nil {
			return calFit{}, fmt.Errorf("calibrate: run %d: %w", i, err)
		}
		if err := checkMeasured(r, f.preps[i]); err != nil {
			return calFit{}, fmt.Errorf("calibrate: run %d: %w", i, err)
		}
	}
	return f, nil
}

// checkMeasured refuses a run the fit cannot use: a precision the model
// does not price, or a TPS that is not physical, i.e. whose MFU by
// torchtitan's FLOP count would exceed the device's BF16 dense peak.
func checkMeasured(r Run, p *Prepared) error {
	if err := CheckPrecision("precision", r.Precision); err != nil || r.Precision == "" {
		return moe.FieldError{Field: "precision", Value: r.Precision,
			Allowed: "a precision the time model prices: " + strings.Join(PricedPrecisions, ", ")}
	}
	perToken := p.convs[string(flops.Torchtitan)]
	if bound := p.dev.BF16FLOPs / perToken; !(r.TPS > 0 && r.TPS <= bound) {
		return moe.FieldError{Field: "tps", Value: r.TPS,
			Allowed: fmt.Sprintf("must be in (0, %.4g] tokens/s per GPU: above it the run would exceed %s's BF16 peak (%.3g FLOP/s at %.4g FLOPs per token)",
				bound, p.dev.Name, p.dev.BF16FLOPs, perToken)}
	}
	return nil
}

// predictTPS returns every run's predicted TPS under c (nil: defaults).
func (f calFit) predictTPS(c *Calibration) ([]float64, error) {
	out := make([]float64, len(f.preps))
	for i, p := range f.preps {
		r, err := p.Run(c)
		if err != nil {
			return nil, err
		}
		out[i] = r.TPS
	}
	return out, nil
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
		m, measured := r.MeasuredReserved(f.preps[i].dev)
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

// recordResiduals sets cal's relative TPS and peak-reserved errors, run by
// run, as the report of the fit.
func (f calFit) recordResiduals(cal *Calibration) error {
	for i, p := range f.preps {
		r, err := p.Run(cal)
		if err != nil {
			return fmt.Errorf("calibrate: %w", err)
		}
		cal.Residuals = append(cal.Residuals, r.TPS/f.runs[i].TPS-1)
		if m, ok := f.runs[i].MeasuredReserved(p.dev); ok {
			v := float64(r.PeakReservedBytes)/m - 1
			cal.MemoryResiduals = append(cal.MemoryResiduals, &v)
		} else {
			cal.MemoryResiduals = append(cal.MemoryResiduals, nil)
		}
	}
	return nil
}
