package sim

import (
	"fmt"
	"math"
	"slices"
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

// perturbed returns cal with parameter name's multiplier times e^h (a link
// efficiency starts from the cluster's default when cal leaves it unset,
// and stays ≤ 1).
func perturbed(cal Calibration, name string, h float64, defaults map[string]float64) *Calibration {
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
	}
	return &cal
}

// tpsInterval is the 90% interval of res.TPS under cal: ln TPS varies with
// the fitted log-multipliers as g (finite differences, one simulation per
// parameter), so its variance is gᵀ·Covariance·g + ResidualSD², and the
// interval is TPS·exp(±1.645·σ). It returns nil when cal carries no
// covariance (a calibration written before intervals, or none fitted).
func (p *Prepared) tpsInterval(cal *Calibration, res Result) (*[2]float64, error) {
	if cal == nil || len(cal.CovarianceParams) == 0 {
		return nil, nil
	}
	defaults := map[string]float64{CalNVLink: p.cl.NVLinkEfficiency, CalNet: p.cl.NetEfficiency}
	g := make([]float64, len(cal.CovarianceParams))
	for j, name := range cal.CovarianceParams {
		r, err := p.Run(perturbed(*cal, name, sensStep, defaults))
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
