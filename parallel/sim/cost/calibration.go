package cost

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/moescope/moescope/internal/band"
	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// Calibration holds named model parameters fitted to measured runs. A zero
// field keeps the model's default. Compute multipliers scale the default
// efficiencies of their op class (1 = unchanged).
type Calibration struct {
	Source string `json:"source,omitempty"`
	// Precision is the recipe of the runs it was fitted on ("" = bf16).
	// Applied to a run of another recipe it scales only what the two
	// share (Covers): not the other recipe's low-precision kernels.
	Precision job.Precision `json:"precision,omitempty"`
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
	// NodeSpread replaces the default spread of node speeds across a job
	// (ComputeSpec.NodeSpread: the scale-out fit stored with the bands)
	// when set; MaxNodes is the most nodes among the runs the calibration
	// was fitted on: a prediction at more nodes extrapolates the spread,
	// and its interval says so (0: one node, or a calibration written
	// before the field).
	NodeSpread *float64 `json:"node_spread,omitempty"`
	MaxNodes   int      `json:"max_nodes,omitempty"`
	// AllocatorOverhead replaces the memory allocator model's fragmentation
	// fraction (reserved = (1 + f)·compute pool + comm pool) when set.
	AllocatorOverhead float64 `json:"allocator_overhead,omitempty"`
	// AllocatorLogSD is the standard deviation of ln AllocatorOverhead
	// (LogSD's scale), from the spread of the runs' measured ÷ simulated
	// reserved memory; 0 when fewer than two runs report it.
	AllocatorLogSD float64 `json:"allocator_overhead_log_sd,omitempty"`
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
	// ResidualRuns names the run of each residual, in the same order, so
	// a reader need not count (calibrate: a --runs run's run_id, else
	// file[position]; a --torchtitan-log run's log file); absent when the
	// caller named none.
	ResidualRuns []string `json:"residual_runs,omitempty"`
	// Covariance is the fit's covariance of the log-multipliers of
	// CovarianceParams (the fitted TPS parameters, in that order), and
	// ResidualSD the spread of ln TPS a prediction carries besides it:
	// together they give a calibrated prediction its 90% interval.
	CovarianceParams []string    `json:"covariance_params,omitempty"`
	Covariance       [][]float64 `json:"covariance,omitempty"`
	ResidualSD       float64     `json:"residual_sd,omitempty"`
}

// NodeSpreadOr is the calibration's node spread, or def when it sets none
// (or there is no calibration).
func (cal *Calibration) NodeSpreadOr(def float64) float64 {
	if cal != nil && cal.NodeSpread != nil {
		return *cal.NodeSpread
	}
	return def
}

// Covers says whether the calibration's scales apply to the low-precision
// kernels of recipe p: it was fitted on runs of p.
func (cal *Calibration) Covers(p job.Precision) bool {
	fitted := cal.Precision
	if fitted == "" {
		fitted = job.BF16
	}
	return fitted == p
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
	CalNodeSpread  = "node_spread"
	CalAllocator   = "allocator_overhead"
)

// RunTPSNoise is the relative standard deviation of one measured TPS
// about what the same configuration measures when run again on the same
// cluster and software release. It is the runs' one noise model: a sweep
// plans with it (which runs pin which parameters, and how tightly) and
// calibrate weighs the runs against its prior with it and decides by it
// what the runs identify, so what a sweep promises is what calibrate fits.
//
// 2%: repeating one job on one cluster moves its throughput by the
// machines' state, which the Llama 3 report measures as a 1–2% diurnal
// swing from clocks (REFERENCES.md); 2%, the swing's upper end, also
// covers a published run's rounded tokens/s (±1.5%, the shared validation
// README) added to the swing's lower end (√(1.5² + 1²) ≈ 1.8%). The
// ±10–20% the same README reports between "identical" configurations of
// different releases is not run-to-run noise but different software:
// runs that mix releases show it as a larger residual spread, which the
// fit then uses for its intervals in place of this.
const RunTPSNoise = 0.02

// TPSParams are the parameters a fit of several runs' TPS may move, in
// fit order (a single run fits CalCompute alone).
var TPSParams = []string{CalGEMM, CalGrouped, CalAttention, CalMemoryBound, CalNVLink, CalNet, CalNodeSpread}

// Defaults are the values the parameters that are not multipliers start
// from on cluster cl: its link efficiencies and the stored spread between
// nodes (band.Stored's NodeSpread).
func Defaults(cl *hw.Cluster) map[string]float64 {
	return map[string]float64{CalNVLink: cl.NVLinkEfficiency, CalNet: cl.NetEfficiency, CalNodeSpread: band.Uncalibrated().NodeSpread}
}

// Value is parameter name's value in c (0: unset, the model's default
// applies); an unknown name is an error.
func (c *Calibration) Value(name string) (float64, error) {
	switch name {
	case CalCompute:
		return c.ComputeScale, nil
	case CalGEMM:
		return c.GEMMScale, nil
	case CalGrouped:
		return c.GroupedScale, nil
	case CalAttention:
		return c.AttentionScale, nil
	case CalMemoryBound:
		return c.MemoryBoundScale, nil
	case CalNVLink:
		return c.NVLinkEfficiency, nil
	case CalNet:
		return c.NetEfficiency, nil
	case CalNodeSpread:
		return c.NodeSpreadOr(0), nil
	case CalAllocator:
		return c.AllocatorOverhead, nil
	}
	return 0, fmt.Errorf("calibration: unknown parameter %q (known: %s, %v, %s)", name, CalCompute, TPSParams, CalAllocator)
}

// LogSD is the fit's standard deviation of ln θ for parameter name, the
// square root of its variance in Covariance: for a small spread, the
// relative standard deviation of θ itself; for the allocator overhead,
// fitted in closed form outside the covariance, AllocatorLogSD. ok is false
// when neither covers name (a parameter kept at its default, or an
// allocator overhead fitted from one run).
func (c *Calibration) LogSD(name string) (sd float64, ok bool) {
	if name == CalAllocator {
		return c.AllocatorLogSD, c.AllocatorLogSD > 0
	}
	i := slices.Index(c.CovarianceParams, name)
	if i < 0 || i >= len(c.Covariance) || i >= len(c.Covariance[i]) || !(c.Covariance[i][i] > 0) {
		return 0, false
	}
	return math.Sqrt(c.Covariance[i][i]), true
}

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
	if v := c.NodeSpread; v != nil && !(*v >= 0 && *v <= hw.MaxSpeedSD) {
		errs = append(errs, fmt.Errorf("node_spread = %v: must be in [0, %v]", *v, hw.MaxSpeedSD))
	}
	if c.MaxNodes < 0 || c.MaxNodes > job.MaxDegree {
		errs = append(errs, fmt.Errorf("max_nodes = %d: must be in [0, %d]", c.MaxNodes, job.MaxDegree))
	}
	if c.AllocatorOverhead < 0 || c.AllocatorOverhead >= 1 || math.IsNaN(c.AllocatorOverhead) {
		errs = append(errs, fmt.Errorf("%s = %v: must be in [0, 1)", CalAllocator, c.AllocatorOverhead))
	}
	if !(c.AllocatorLogSD >= 0) || math.IsInf(c.AllocatorLogSD, 1) {
		errs = append(errs, fmt.Errorf("allocator_overhead_log_sd = %v: must be finite and ≥ 0", c.AllocatorLogSD))
	}
	errs = append(errs, c.validateCovariance())
	if n := len(c.ResidualRuns); n > 0 && n != len(c.Residuals) {
		errs = append(errs, fmt.Errorf("residual_runs: %d names for %d residuals: one per residual, in the same order", n, len(c.Residuals)))
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

// validateCovariance checks the fit's uncertainty fields: a square,
// symmetric matrix over named TPS parameters with positive finite
// variances, and a residual spread in [0, 1).
func (c *Calibration) validateCovariance() error {
	k := len(c.CovarianceParams)
	if len(c.Covariance) != k {
		return fmt.Errorf("covariance: %d rows for %d covariance_params", len(c.Covariance), k)
	}
	for a, name := range c.CovarianceParams {
		if name != CalCompute && !slices.Contains(TPSParams, name) {
			return fmt.Errorf("covariance_params[%d] = %q: not a TPS parameter (%s, %v)", a, name, CalCompute, TPSParams)
		}
		row := c.Covariance[a]
		if len(row) != k {
			return fmt.Errorf("covariance row %d: %d entries, want %d", a, len(row), k)
		}
		for b, v := range row {
			if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v-c.Covariance[b][a]) > 1e-9*(1+math.Abs(v)) {
				return fmt.Errorf("covariance[%d][%d] = %v: must be finite and symmetric", a, b, v)
			}
		}
		if !(row[a] > 0 && row[a] < 100) {
			return fmt.Errorf("covariance[%d][%d] = %v: a variance of a log-multiplier must be in (0, 100)", a, a, row[a])
		}
	}
	if !(c.ResidualSD >= 0 && c.ResidualSD < 1) {
		return fmt.Errorf("residual_sd = %v: must be in [0, 1)", c.ResidualSD)
	}
	return nil
}

// Perturbed returns cal with parameter name's multiplier times e^h (a link
// efficiency starts from the cluster's default, defaults[name], when cal
// leaves it unset, and stays ≤ 1): what the TPS interval probes.
func (cal Calibration) Perturbed(name string, h float64, defaults map[string]float64) *Calibration {
	m := math.Exp(h)
	switch name {
	case CalCompute:
		cal.ComputeScale = scaleOr1(cal.ComputeScale) * m
	case CalGEMM:
		cal.GEMMScale = scaleOr1(cal.GEMMScale) * m
	case CalGrouped:
		cal.GroupedScale = scaleOr1(cal.GroupedScale) * m
	case CalAttention:
		cal.AttentionScale = scaleOr1(cal.AttentionScale) * m
	case CalMemoryBound:
		cal.MemoryBoundScale = scaleOr1(cal.MemoryBoundScale) * m
	case CalNVLink:
		v := cal.NVLinkEfficiency
		if v == 0 {
			v = defaults[CalNVLink]
		}
		cal.NVLinkEfficiency = math.Min(1, v*m)
	case CalNet:
		v := cal.NetEfficiency
		if v == 0 {
			v = defaults[CalNet]
		}
		cal.NetEfficiency = math.Min(1, v*m)
	case CalNodeSpread:
		v := math.Min(hw.MaxSpeedSD, cal.NodeSpreadOr(defaults[CalNodeSpread])*m)
		cal.NodeSpread = &v
	}
	return &cal
}

// Allocator is the allocator model a under calibration c: its
// fragmentation replaced by the calibrated overhead when c has one. It is
// the one place a calibration reaches the memory model.
func (c *Calibration) Allocator(a memory.Allocator) memory.Allocator {
	if c != nil && c.AllocatorOverhead > 0 {
		a.Fragmentation = c.AllocatorOverhead
		a.Source = "calibrated"
	}
	return a
}
