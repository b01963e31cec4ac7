package calib

import (
	"fmt"
	"math"
	"runtime"

	"golang.org/x/sync/errgroup"
	"gonum.org/v1/gonum/mat"

	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// The TPS fit. Unknowns are log-multipliers x of the calibration
// parameters (calState maps them onto a cost.Calibration). It minimizes
//
//	Σ_runs (ln(predicted/measured TPS) / σRun)² + Σ_params (x / σPrior)²
//
// by Levenberg–Marquardt with finite-difference sensitivities: the
// grounded defaults are the prior (x = 0), so a parameter the runs say
// little about stays near its default instead of running to an absurd
// value, and one the runs pin down moves as far as they say. σRun is
// cost.RunTPSNoise, the runs' noise model shared with the sweep that plans
// them: it weighs the runs against the prior, sets what they identify
// (IdentifiedParams), and is the residual spread used for intervals when
// the runs leave no degrees of freedom.
const (
	// σPrior is the prior's spread of a log-multiplier: a default within a
	// factor 2 of the truth at one standard deviation.
	sigmaPrior = math.Ln2
	// sensStep is the finite-difference step in x (a 5% multiplier,
	// sim.SensitivityStep: the TPS interval probes with it too).
	sensStep = sim.SensitivityStep
	// identifyRatio is how many times the prior's information about a
	// parameter the runs must carry, beyond what the parameters already
	// chosen explain, for it to count as identified: then the prior pulls
	// its estimate by at most 1/(1+50) ≈ 2% of its log-multiplier.
	identifyRatio = 50
)

// logTPS returns ln(predicted TPS) of every run under x (st's
// parameters).
func (f calFit) logTPS(st calState, x []float64) ([]float64, error) {
	lp, err := f.logTPSAt(st, [][]float64{x})
	if err != nil {
		return nil, err
	}
	return lp[0], nil
}

// logTPSAt returns ln(predicted TPS) of every run under each of xs,
// simulating every (x, run) pair at once on GOMAXPROCS goroutines: one
// pool over all of them, so that a long run does not leave the other
// cores idle at the end of each x. An error is the first by x, then run.
func (f calFit) logTPSAt(st calState, xs [][]float64) ([][]float64, error) {
	n := len(f.preps)
	out := make([][]float64, len(xs))
	errs := make([]error, len(xs)*n)
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for a, x := range xs {
		c := st.calibration(x, st.base)
		out[a] = make([]float64, n)
		for i, p := range f.preps {
			g.Go(func() error {
				tps, err := p.TPS(c)
				out[a][i], errs[a*n+i] = math.Log(tps), err
				return nil
			})
		}
	}
	_ = g.Wait() // the goroutines report in errs
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("calibrate: %w", err)
		}
	}
	return out, nil
}

// sensitivities returns J (runs × params): ∂ ln TPS_i / ∂ x_j at x, by
// forward differences, and ln TPS at x.
func (f calFit) sensitivities(st calState, x []float64) (*mat.Dense, []float64, error) {
	xs := [][]float64{x}
	for j := range st.names {
		xj := append([]float64(nil), x...)
		xj[j] += sensStep
		xs = append(xs, xj)
	}
	lp, err := f.logTPSAt(st, xs)
	if err != nil {
		return nil, nil, err
	}
	base := lp[0]
	J := mat.NewDense(len(f.preps), max(1, len(st.names)), nil)
	for j, moved := range lp[1:] {
		for i := range moved {
			J.Set(i, j, (moved[i]-base[i])/sensStep)
		}
	}
	return J, base, nil
}

// identify picks, from candidates, the parameters the runs can tell
// apart at the defaults (IdentifiedParams), and returns the chosen, the
// rest, and the chosen columns of the sensitivities to start the fit.
func (f calFit) identify(candidates []string, defaults map[string]float64) (chosen, rest []string, J0 *mat.Dense, lp0 []float64, err error) {
	st := calState{names: candidates, defaults: defaults}
	J, lp0, err := f.sensitivities(st, make([]float64, len(candidates)))
	if err != nil {
		return nil, nil, nil, nil, err
	}
	cols := make([][]float64, len(candidates))
	for j := range cols {
		cols[j] = mat.Col(nil, j, J)
	}
	var idx []int
	for j, ok := range IdentifiedParams(cols) {
		if ok {
			chosen = append(chosen, candidates[j])
			idx = append(idx, j)
		} else {
			rest = append(rest, candidates[j])
		}
	}
	n := len(f.preps)
	J0 = mat.NewDense(n, max(1, len(idx)), nil)
	for a, j := range idx {
		for i := 0; i < n; i++ {
			J0.Set(i, a, J.At(i, j))
		}
	}
	return chosen, rest, J0, lp0, nil
}

// IdentifiedParams is calibrate's rule for which parameters a set of runs
// identifies, given each parameter's sensitivities cols[j][i] =
// ∂ ln TPS_i / ∂ ln θ_j over the runs i: pivoted Gram–Schmidt, taking the
// column with the largest part not explained by those already taken while
// the runs' information about it, |q|²/σRun², is at least identifyRatio
// times the prior's, 1/σPrior², and never more parameters than runs. A
// sweep planned with it identifies exactly what calibrate will fit.
func IdentifiedParams(cols [][]float64) []bool {
	taken := make([]bool, len(cols))
	if len(cols) == 0 {
		return taken
	}
	n := len(cols[0])
	minNorm := math.Sqrt(identifyRatio) * cost.RunTPSNoise / sigmaPrior
	rest := make([][]float64, len(cols))
	for j, c := range cols {
		rest[j] = append([]float64(nil), c...)
	}
	for chosen := 0; chosen < min(n, len(cols)); chosen++ {
		best, bestNorm := -1, 0.0
		for j, c := range rest {
			if taken[j] {
				continue
			}
			if norm := math.Sqrt(dot(c, c)); norm > bestNorm {
				best, bestNorm = j, norm
			}
		}
		if best < 0 || bestNorm < minNorm {
			break
		}
		taken[best] = true
		q := rest[best]
		qq := dot(q, q)
		for j, c := range rest {
			if taken[j] {
				continue
			}
			a := dot(c, q) / qq
			for i := range c {
				c[i] -= a * q[i]
			}
		}
	}
	return taken
}

func dot(a, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// fitResult is the fitted log-multipliers, their covariance and the
// residual spread used for intervals.
type fitResult struct {
	x          []float64
	cov        *mat.SymDense
	residualSD float64
}

// objective is the fit's weighted sum of squares at residuals r and x.
func objective(r, x []float64) float64 {
	v := 0.0
	for _, ri := range r {
		v += (ri / cost.RunTPSNoise) * (ri / cost.RunTPSNoise)
	}
	for _, xi := range x {
		v += (xi / sigmaPrior) * (xi / sigmaPrior)
	}
	return v
}

// fitTPS runs Levenberg–Marquardt over st's parameters from the defaults,
// where the sensitivities are J and ln TPS is lp (identify's). measured
// holds ln(measured TPS) per run. Each accepted step updates J by
// Broyden's rank-one rule instead of re-differencing (ln TPS is close to
// linear in the log-multipliers, so the update stays accurate, and a step
// costs one simulation per run); the covariance uses a fresh J at the end.
func (f calFit) fitTPS(st calState, J *mat.Dense, lp, measured []float64) (fitResult, error) {
	k := len(st.names)
	x := make([]float64, k)
	resid := func(lp []float64) []float64 {
		r := make([]float64, len(lp))
		for i := range lp {
			r[i] = lp[i] - measured[i]
		}
		return r
	}
	r := resid(lp)
	obj, lambda := objective(r, x), 1e-3
	for iter := 0; iter < 30; iter++ {
		A, g := normalEquations(J, r, x)
		for j := 0; j < k; j++ {
			A.SetSym(j, j, A.At(j, j)*(1+lambda))
		}
		var step mat.VecDense
		if err := step.SolveVec(A, mat.NewVecDense(k, g)); err != nil {
			return fitResult{}, fmt.Errorf("calibrate: the fit's normal equations are singular: %w", err)
		}
		xt := make([]float64, k)
		maxStep := 0.0
		for j := range xt {
			xt[j] = x[j] - step.AtVec(j)
			maxStep = max(maxStep, math.Abs(step.AtVec(j)))
		}
		lpt, err := f.logTPS(st, xt)
		if err != nil {
			return fitResult{}, err
		}
		rt := resid(lpt)
		if ot := objective(rt, xt); ot < obj {
			broyden(J, x, xt, r, rt)
			x, r, obj, lambda = xt, rt, ot, lambda/10
			if maxStep < 1e-4 {
				break
			}
		} else {
			lambda *= 10
			if lambda > 1e8 {
				break
			}
		}
	}
	J, lpx, err := f.sensitivities(st, x)
	if err != nil {
		return fitResult{}, err
	}
	return f.uncertainty(J, resid(lpx), x)
}

// broyden updates J after the step x → xt moved the residuals r → rt:
// J += (Δr − J·Δx)·Δxᵀ / (Δxᵀ·Δx).
func broyden(J *mat.Dense, x, xt, r, rt []float64) {
	n, k := J.Dims()
	dx := make([]float64, k)
	for j := range dx {
		dx[j] = xt[j] - x[j]
	}
	dd := dot(dx, dx)
	if dd == 0 {
		return
	}
	for i := 0; i < n; i++ {
		pred := 0.0
		for j := 0; j < k; j++ {
			pred += J.At(i, j) * dx[j]
		}
		u := (rt[i] - r[i] - pred) / dd
		for j := 0; j < k; j++ {
			J.Set(i, j, J.At(i, j)+u*dx[j])
		}
	}
}

// information is JᵀJ/s² + I/σPrior²: what runs of spread s and the prior
// know about the log-multipliers.
func information(J *mat.Dense, s float64) *mat.SymDense {
	n, k := J.Dims()
	A := mat.NewSymDense(k, nil)
	for a := 0; a < k; a++ {
		for b := a; b < k; b++ {
			v := 0.0
			for i := 0; i < n; i++ {
				v += J.At(i, a) * J.At(i, b)
			}
			v /= s * s
			if a == b {
				v += 1 / (sigmaPrior * sigmaPrior)
			}
			A.SetSym(a, b, v)
		}
	}
	return A
}

// normalEquations returns the Gauss–Newton system of the objective at
// (J, r, x): A = information(J, σRun), g = Jᵀr/σRun² + x/σPrior².
func normalEquations(J *mat.Dense, r, x []float64) (*mat.SymDense, []float64) {
	n, k := J.Dims()
	g := make([]float64, k)
	for a := 0; a < k; a++ {
		for i := 0; i < n; i++ {
			g[a] += J.At(i, a) * r[i] / (cost.RunTPSNoise * cost.RunTPSNoise)
		}
		g[a] += x[a] / (sigmaPrior * sigmaPrior)
	}
	return information(J, cost.RunTPSNoise), g
}

// uncertainty estimates the fit's residual spread (the RMS residual over
// the degrees of freedom left, never below σRun; σRun when none is left)
// and the covariance of x: (JᵀJ/s² + I/σPrior²)⁻¹.
func (f calFit) uncertainty(J *mat.Dense, r, x []float64) (fitResult, error) {
	n, k := len(r), len(x)
	s := cost.RunTPSNoise
	if n > k {
		s = math.Max(s, math.Sqrt(dot(r, r)/float64(n-k)))
	}
	var ch mat.Cholesky
	if !ch.Factorize(information(J, s)) {
		return fitResult{}, fmt.Errorf("calibrate: the fit's information matrix is not positive definite")
	}
	var cov mat.SymDense
	if err := ch.InverseTo(&cov); err != nil {
		return fitResult{}, fmt.Errorf("calibrate: %w", err)
	}
	return fitResult{x: x, cov: &cov, residualSD: s}, nil
}
