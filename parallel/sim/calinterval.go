package sim

import (
	"math"
	"slices"

	"github.com/moescope/moescope/internal/band"
	"github.com/moescope/moescope/internal/stats"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

const (
	// sensStep is the finite-difference step in a log-multiplier (a 5%
	// multiplier) of the TPS interval and of calibrate's fit.
	sensStep = 0.05
	// intervalZ is the two-sided 90% normal quantile.
	intervalZ = 1.6448536269514722
)

// SensitivityStep is the step in a log-multiplier (a 5% multiplier) by
// which calibrate, and a sweep planning for it, probe ∂ ln TPS / ∂ ln θ.
const SensitivityStep = sensStep

// tpsInterval is the 90% interval of res.TPS under cal: ln TPS varies with
// the fitted log-multipliers as g (finite differences, one simulation per
// parameter), so its variance is gᵀ·Covariance·g + ResidualSD², and the
// interval is TPS·exp(±1.645·σ). It returns nil when cal carries no
// covariance (a calibration written before intervals, or none fitted).
func (p *Prepared) tpsInterval(cal *cost.Calibration, res Result) (*[2]float64, error) {
	if cal == nil || len(cal.CovarianceParams) == 0 {
		return nil, nil
	}
	defaults := cost.Defaults(p.cl)
	g := make([]float64, len(cal.CovarianceParams))
	for j, name := range cal.CovarianceParams {
		r, err := p.Run(cal.Perturbed(name, sensStep, defaults))
		if err != nil {
			return nil, err
		}
		g[j] = (math.Log(r.TPS) - math.Log(res.TPS)) / sensStep
	}
	v := cal.ResidualSD * cal.ResidualSD
	for a := range g {
		for b := range g {
			v += g[a] * cal.Covariance[a][b] * g[b]
		}
	}
	ext, err := p.beyondCalibration(cal, res)
	if err != nil {
		return nil, err
	}
	sd := math.Sqrt(v + ext*ext)
	return &[2]float64{res.TPS * math.Exp(-intervalZ*sd), res.TPS * math.Exp(intervalZ*sd)}, nil
}

// beyondCalibration is the standard deviation of ln TPS a prediction at
// more nodes than cal's runs spanned adds for the spread between nodes:
// the fitted spread is uncertain by the published sources' disagreement
// (band.Stored's NodeSpreadSD), and a calibration pins what the spread
// cost at its own node count, E[max of MaxNodes normals], but not the
// rest of what it costs at this one. Zero when cal fitted the spread
// itself, or the run is no larger than its runs.
func (p *Prepared) beyondCalibration(cal *cost.Calibration, res Result) (float64, error) {
	sd := band.Uncalibrated().NodeSpreadSD
	n, fitted := p.Nodes(), max(cal.MaxNodes, 1)
	if sd == 0 || n <= fitted || slices.Contains(cal.CovarianceParams, cost.CalNodeSpread) {
		return 0, nil
	}
	probe := *cal
	s0 := cal.NodeSpreadOr(0)
	s := s0 + spreadProbe
	if s > hw.MaxSpeedSD { // the spread's bound: probe below instead
		s = s0 - spreadProbe
	}
	probe.NodeSpread = &s
	r, err := p.Run(&probe)
	if err != nil {
		return 0, err
	}
	perSpread := (math.Log(r.TPS) - math.Log(res.TPS)) / (s - s0)
	unpinned := 1 - stats.ExpectedMaxNormal(fitted)/stats.ExpectedMaxNormal(n)
	return math.Abs(perSpread) * unpinned * sd, nil
}

// spreadProbe is the step in the spread between nodes by which
// beyondCalibration takes ∂ ln TPS / ∂ spread (the loss is linear in it).
const spreadProbe = 0.01
