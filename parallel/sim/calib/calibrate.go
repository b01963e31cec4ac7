package calib

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/cost"
	"github.com/moescope/moescope/parallel/sim/published"
	"golang.org/x/sync/errgroup"
	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/stat"
)

// calState maps the optimizer's vector onto a calibration: multipliers are
// exp(x); link efficiencies default·exp(x), capped at 1.
type calState struct {
	names    []string // fitted TPS parameters, in x order
	defaults map[string]float64
	base     cost.Calibration // what the trial calibrations start from
}

func (s calState) calibration(x []float64, base cost.Calibration) *cost.Calibration {
	c := base
	for i, n := range s.names {
		// Multipliers stay within [0.01, 100] (Validate's range).
		v := math.Max(0.01, math.Min(100, math.Exp(x[i])))
		switch n {
		case cost.CalCompute:
			c.ComputeScale = v
		case cost.CalGEMM:
			c.GEMMScale = v
		case cost.CalGrouped:
			c.GroupedScale = v
		case cost.CalAttention:
			c.AttentionScale = v
		case cost.CalMemoryBound:
			c.MemoryBoundScale = v
		case cost.CalNVLink:
			c.NVLinkEfficiency = math.Max(0.01, math.Min(1, s.defaults[n]*v))
		case cost.CalNet:
			c.NetEfficiency = math.Max(0.01, math.Min(1, s.defaults[n]*v))
		case cost.CalNodeSpread:
			sd := math.Min(hw.MaxSpeedSD, s.defaults[n]*v)
			c.NodeSpread = &sd
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
func Calibrate(runs []published.Run) (*cost.Calibration, error) {
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
	prec, err := runsRecipe(runs)
	if err != nil {
		return nil, err
	}
	cl0 := f.preps[0].Cluster()
	st := calState{defaults: cost.Defaults(cl0)}
	cal := &cost.Calibration{Source: fmt.Sprintf("moescope calibrate, %d run(s)", len(runs)), Precision: prec, MaxNodes: f.maxNodes()}
	if s := st.defaults[cost.CalNodeSpread]; s > 0 {
		// Every calibration prices the slowest node at the stored spread
		// (sim's computeSpec), in its fit as in its predictions.
		cal.NodeSpread = &s
	}
	st.base = *cal
	candidates := cost.TPSParams
	if st.defaults[cost.CalNodeSpread] == 0 {
		// A multiplier of no spread moves nothing: without a stored fit the
		// spread is not a candidate (kept at 0, named).
		candidates = slices.DeleteFunc(slices.Clone(candidates), func(n string) bool { return n == cost.CalNodeSpread })
	}
	if len(runs) == 1 {
		candidates = []string{cost.CalCompute}
	}
	var J0 *mat.Dense
	var lp0 []float64
	if st.names, cal.Kept, J0, lp0, err = f.identify(candidates, st.defaults); err != nil {
		return nil, err
	}
	if len(runs) == 1 {
		cal.Kept = append(cal.Kept, cost.TPSParams...)
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
	frag, logSD, ok, why, err := f.fitAllocator()
	switch {
	case err != nil:
		return nil, err
	case ok:
		cal.AllocatorOverhead, cal.AllocatorLogSD = frag, logSD
		cal.Fitted = append(cal.Fitted, cost.CalAllocator)
	default:
		cal.Kept = append(cal.Kept, cost.CalAllocator)
		cal.Notes = append(cal.Notes, why)
	}
	if err := f.recordResiduals(cal); err != nil {
		return nil, err
	}
	return cal, cal.Validate()
}

// maxNodes is the most nodes any of the runs spans.
func (f calFit) maxNodes() int {
	n := 0
	for _, p := range f.preps {
		n = max(n, p.Nodes())
	}
	return n
}

// calFit is what a calibration fits to: the measured runs and their
// prepared simulations, in the same order.
type calFit struct {
	runs  []published.Run
	preps []*sim.Prepared
}

// prepareFit prepares every run's simulation once, the runs in parallel;
// the fit then only re-runs them under trial calibrations. An error is
// the first run's.
func prepareFit(runs []published.Run) (calFit, error) {
	f := calFit{runs: runs, preps: make([]*sim.Prepared, len(runs))}
	errs := make([]error, len(runs))
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, r := range runs {
		g.Go(func() error {
			f.preps[i], errs[i] = prepareRun(r)
			return nil
		})
	}
	_ = g.Wait() // the goroutines report in errs
	for i, err := range errs {
		if err != nil {
			return calFit{}, fmt.Errorf("calibrate: run %d: %w", i, err)
		}
	}
	return f, nil
}

// prepareRun prepares one measured run's simulation and checks that the
// fit can use its measurement.
func prepareRun(r published.Run) (*sim.Prepared, error) {
	in, err := published.InputForRun(r)
	if err != nil {
		return nil, err
	}
	p, err := sim.Prepare(in)
	if err != nil {
		return nil, err
	}
	return p, checkMeasured(r, p)
}

// checkMeasured refuses a run the fit cannot use: a precision the model
// does not price, or a TPS that is not physical, i.e. whose MFU by
// torchtitan's FLOP count would exceed the device's BF16 dense peak.
func checkMeasured(r published.Run, p *sim.Prepared) error {
	prec, err := r.PrecisionRecipe()
	if err == nil {
		err = prec.Check("precision")
	}
	if err != nil {
		return err
	}
	perToken := p.FLOPsPerToken(flops.Torchtitan)
	peak, name := p.Device().BF16FLOPs, "BF16"
	switch {
	case prec.FP4():
		// Converted GEMMs may run up to the FP4 peak; no run exceeds it.
		peak, name = p.Device().FP4FLOPs, "FP4"
	case prec.LowPrecision():
		// Converted GEMMs may run up to the FP8 peak; no run exceeds it.
		peak, name = p.Device().FP8FLOPs, "FP8"
	}
	if bound := peak / perToken; !(r.TPS > 0 && r.TPS <= bound) {
		return moe.FieldError{Field: "tps", Value: r.TPS,
			Allowed: fmt.Sprintf("must be in (0, %.4g] tokens/s per GPU: above it the run would exceed %s's %s peak (%.3g FLOP/s at %.4g FLOPs per token)",
				bound, p.Device().Name, name, peak, perToken)}
	}
	return nil
}

// runsRecipe is the one recipe of runs: a calibration is fitted per recipe,
// as the kernels a low-precision recipe runs differ from bf16's.
func runsRecipe(runs []published.Run) (job.Precision, error) {
	var first job.Precision
	for i, r := range runs {
		p, err := r.PrecisionRecipe()
		if err != nil {
			return "", fmt.Errorf("calibrate: run %d: %w", i, err)
		}
		if i == 0 {
			first = p
		} else if p != first {
			return "", fmt.Errorf("calibrate: run %d: precision = %s, run 0's is %s: fit one calibration per recipe (a bf16 calibration applies to an fp8 run's bf16 parts; an fp8 fit measures its fp8 kernels)", i, p, first)
		}
	}
	return first, nil
}

// fitAllocator fits the allocator's unmodelled fraction f to the runs that
// report peak reserved memory. Predicted reserved is S·(1+f), S the
// simulated pools, so Σ ln²(S_k·(1+f)/M_k) is least at
// ln(1+f) = mean_k ln(M_k/S_k): the fit is that closed form. It is
// identified only when f ≥ 0; a negative f would mean the runs hold less
// than the simulated pools alone (the model over-predicts their memory, an
// error no allocator overhead can repair), and the default is kept with
// why. ok is false when no run reports reserved memory or f is not
// identified. logSD is the standard deviation of ln f: the standard error
// of that mean, s/√n with s the sample standard deviation of the ln(M_k/S_k),
// carried to ln f by the delta method (d ln f / d ln(1+f) = (1+f)/f); 0
// from one run, whose spread is unknown.
func (f calFit) fitAllocator() (frag, logSD float64, ok bool, why string, err error) {
	a := memory.DefaultAllocator
	a.Fragmentation = 0
	var logs []float64
	for i, r := range f.runs {
		m, measured := r.MeasuredReserved(f.preps[i].Device())
		if !measured {
			continue
		}
		p, err := memory.Replay(f.preps[i].Memory().Events, a, f.preps[i].Input().MemoryOptions().Segments)
		if err != nil {
			return 0, 0, false, "", err
		}
		logs = append(logs, math.Log(m/float64(p.Reserved)))
	}
	n := len(logs)
	if n == 0 {
		return 0, 0, false, cost.CalAllocator + ": no run reports peak reserved memory", nil
	}
	mean, s := stat.MeanStdDev(logs, nil)
	frag = math.Expm1(mean)
	if frag < 0 {
		return 0, 0, false, fmt.Sprintf("%s: not identified: the %d run(s) reporting reserved memory measure %.1f%% below the simulated pools alone "+
			"(geometric mean), which no allocator overhead ≥ 0 repairs; the default is kept", cost.CalAllocator, n, -100*frag), nil
	}
	if frag >= 0.95 {
		return 0, 0, false, fmt.Sprintf("%s: not identified: the runs measure %.0f%% above the simulated pools, beyond any allocator overhead (< 95%%); "+
			"the default is kept", cost.CalAllocator, 100*frag), nil
	}
	if n > 1 && frag > 0 {
		logSD = s / math.Sqrt(float64(n)) * (1 + frag) / frag
	}
	return frag, logSD, true, "", nil
}

// recordResiduals sets cal's relative TPS and peak-reserved errors, run by
// run, as the report of the fit.
func (f calFit) recordResiduals(cal *cost.Calibration) error {
	for i, p := range f.preps {
		r, err := p.Run(cal)
		if err != nil {
			return fmt.Errorf("calibrate: %w", err)
		}
		cal.Residuals = append(cal.Residuals, r.TPS/f.runs[i].TPS-1)
		if m, ok := f.runs[i].MeasuredReserved(p.Device()); ok {
			v := float64(r.PeakReservedBytes)/m - 1
			cal.MemoryResiduals = append(cal.MemoryResiduals, &v)
		} else {
			cal.MemoryResiduals = append(cal.MemoryResiduals, nil)
		}
	}
	return nil
}
