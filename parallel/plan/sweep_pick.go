package plan

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"gonum.org/v1/gonum/mat"

	"github.com/moescope/moescope/parallel/sim/calib"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// information is F = I + Σ_jobs s sᵀ / σ² over SweepParams, σ the
// runs' noise model (cost.RunTPSNoise).
func information(jobs []SweepJob) *mat.SymDense {
	n := len(SweepParams)
	f := mat.NewSymDense(n, nil)
	for i := range n {
		f.SetSym(i, i, 1)
	}
	for _, j := range jobs {
		v := sensVector(j)
		f.SymRankOne(f, 1/(cost.RunTPSNoise*cost.RunTPSNoise), v)
	}
	return f
}

func sensVector(j SweepJob) *mat.VecDense {
	v := mat.NewVecDense(len(SweepParams), nil)
	for i, p := range SweepParams {
		v.SetVec(i, j.Sensitivity[p])
	}
	return v
}

// logDet is ln det F (F is positive definite: identity plus outer
// products).
func logDet(f *mat.SymDense) float64 {
	var ch mat.Cholesky
	if !ch.Factorize(f) {
		return math.Inf(-1)
	}
	return ch.LogDet()
}

// posteriorStd is √(F⁻¹)_jj per parameter.
func posteriorStd(jobs []SweepJob) []float64 {
	var ch mat.Cholesky
	out := make([]float64, len(SweepParams))
	if !ch.Factorize(information(jobs)) {
		for i := range out {
			out[i] = math.Inf(1)
		}
		return out
	}
	var inv mat.SymDense
	if err := ch.InverseTo(&inv); err != nil {
		for i := range out {
			out[i] = math.Inf(1)
		}
		return out
	}
	for i := range out {
		out[i] = math.Sqrt(inv.At(i, i))
	}
	return out
}

// minGain is the smallest gain in ln det F worth another run (a 10%
// smaller volume of the parameters' uncertainty).
const minGain = 0.1

// pickJobs starts from the predicted optimum and the most informative
// two-host run, then adds the candidate with the largest gain in ln det F
// while it gains at least minGain, up to maxJobs (and to at least 3 while
// candidates remain). Each job's Why names what it pins.
func pickJobs(cands []SweepJob, maxJobs int, best Point, twoHost int) []SweepJob {
	var chosen []SweepJob
	taken := make([]bool, len(cands))
	add := func(i int, why string) {
		before := posteriorStd(chosen)
		chosen = append(chosen, cands[i])
		taken[i] = true
		chosen[len(chosen)-1].Why = why + "; " + informs(before, posteriorStd(chosen), cands[i])
	}
	for i, c := range cands {
		if c.Point == best {
			add(i, fmt.Sprintf("the predicted optimum at %d GPUs", c.Point.Layout.GPUs))
			break
		}
	}
	if i := bestGain(cands, taken, chosen, func(c SweepJob) bool { return c.Point.Layout.GPUs == twoHost && twoHost > best.Layout.GPUs }); i >= 0 {
		add(i, fmt.Sprintf("the two-host run (%d GPUs): traffic crosses the network, as in the seed study", twoHost))
	}
	for len(chosen) < maxJobs {
		i := bestGain(cands, taken, chosen, func(SweepJob) bool { return true })
		if i < 0 {
			break
		}
		gain := logDet(information(append(chosen[:len(chosen):len(chosen)], cands[i]))) - logDet(information(chosen))
		if gain < minGain && len(chosen) >= 3 {
			break
		}
		add(i, fmt.Sprintf("largest information gain left (ln det F +%.2f)", gain))
	}
	return chosen
}

// bestGain is the untaken candidate passing ok with the largest ln det F
// after it joins chosen (-1 if none).
func bestGain(cands []SweepJob, taken []bool, chosen []SweepJob, ok func(SweepJob) bool) int {
	best, bestV := -1, math.Inf(-1)
	for i, c := range cands {
		if taken[i] || !ok(c) {
			continue
		}
		if v := logDet(information(append(chosen[:len(chosen):len(chosen)], c))); v > bestV {
			best, bestV = i, v
		}
	}
	return best
}

// informs names the parameters whose posterior uncertainty the job cut
// the most, with the job's sensitivity to each.
func informs(before, after []float64, j SweepJob) string {
	type cut struct {
		name  string
		ratio float64
	}
	var cuts []cut
	for i, p := range SweepParams {
		// A parameter the run barely moves (|s| < 0.02, below what
		// calib.Calibrate's identifiability probe sees) is narrowed only
		// through its correlation with others: not named.
		if r := after[i] / before[i]; r < 0.9 && math.Abs(j.Sensitivity[p]) >= 0.02 {
			cuts = append(cuts, cut{p, r})
		}
	}
	sort.Slice(cuts, func(a, b int) bool { return cuts[a].ratio < cuts[b].ratio })
	if len(cuts) == 0 {
		return "it narrows no parameter by 10% more"
	}
	var parts []string
	for k, c := range cuts {
		if k == 3 {
			break
		}
		parts = append(parts, fmt.Sprintf("%s (TPS moves %.2f%% per 1%%; uncertainty ×%.2f)", c.name, j.Sensitivity[c.name], c.ratio))
	}
	return "it pins " + strings.Join(parts, ", ")
}

// paramStatus is the posterior standard deviation of each parameter after
// the chosen jobs, and whether calibrate identifies it from them.
func paramStatus(jobs []SweepJob) []ParamStatus {
	std := posteriorStd(jobs)
	cols := make([][]float64, len(SweepParams))
	for i, p := range SweepParams {
		for _, j := range jobs {
			cols[i] = append(cols[i], j.Sensitivity[p])
		}
	}
	ok := calib.IdentifiedParams(cols)
	out := make([]ParamStatus, len(SweepParams))
	for i, p := range SweepParams {
		out[i] = ParamStatus{Name: p, Std: std[i], Identified: ok[i]}
	}
	return out
}
