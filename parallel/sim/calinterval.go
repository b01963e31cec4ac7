package sim

import (
	"math"

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
	defaults := map[string]float64{cost.CalNVLink: p.cl.NVLinkEfficiency, cost.CalNet: p.cl.NetEfficiency}
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
	sd := math.Sqrt(v)
	return &[2]float64{res.TPS * math.Exp(-intervalZ*sd), res.TPS * math.Exp(intervalZ*sd)}, nil
}
