package validate

import (
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/cost"
	"github.com/moescope/moescope/parallel/sim/published"
)

// The scale-out fit. A scaling series is runs of one source at one per-GPU
// configuration (model, GPU, cluster, precision, release, layout but for
// its data-parallel degrees, sequence, checkpointing and settings; the
// local batch may differ) on two or more node counts. What a series loses
// per GPU from its smallest run to each larger one, beyond what the
// mechanisms priced without a spread between nodes predict, is the
// evidence for that spread: the slowest of n nodes costs
// s·E[max of n standard normals] (cost.NodeSpreadLoss), so each larger run
// i gives r_i = ln(measured_i/measured_0) − ln(predicted_i/predicted_0) at
// s = 0 and g_i = ∂ ln(predicted_i/predicted_0)/∂s, and a source's
// estimate is the least-squares s = Σ r·g / Σ g² over its runs. Series of
// one source share a cluster and a release, so a source is one
// observation; the fitted spread is the median of the sources' estimates
// (a source whose loss comes from a mechanism not modelled moves a median
// least), used only with at least minScaleSources sources: fewer, and
// moescope prices the mechanisms alone. Each source's drops are also
// predicted with the spread fitted without it (leave-one-source-out).
const (
	minScaleSources = 3
	// spreadProbe is the spread at which ∂/∂s is taken by a difference (the
	// loss is linear in s, so the step's size does not matter).
	spreadProbe = 0.01
)

// ScaleOut is the scale-out validation and fit of a set of runs.
type ScaleOut struct {
	Series  []ScaleSeries `json:"series"`
	Sources []ScaleSource `json:"sources"`
	// NodeSpread is the fitted spread (0 with fewer than minScaleSources
	// sources), NodeSpreadSD the standard deviation of the sources'
	// estimates.
	NodeSpread   float64 `json:"node_spread"`
	NodeSpreadSD float64 `json:"node_spread_sd"`
	// LeaveOneOut summarizes |predicted − measured drop| (fractions of
	// TPS) of every larger run with the spread fitted without its source;
	// Mechanisms the same with no spread.
	LeaveOneOut *Summary `json:"leave_one_source_out_error,omitempty"`
	Mechanisms  *Summary `json:"mechanisms_only_error,omitempty"`
}

// ScaleSeries is one scaling series, its runs in GPU order (the first is
// the reference).
type ScaleSeries struct {
	File  string     `json:"file"`
	Model string     `json:"model"`
	GPU   string     `json:"gpu"`
	Runs  []ScaleRun `json:"runs"`
}

// ScaleRun is one run of a scaling series. Drops are 1 − TPS ÷ the
// reference run's TPS (measured, or predicted the way named).
type ScaleRun struct {
	Name  string `json:"name"`
	GPUs  int    `json:"gpus"`
	Nodes int    `json:"nodes"`
	// Predicted TPS without a spread between nodes, and its change per
	// unit of spread (∂ ln TPS / ∂s).
	Mechanisms float64 `json:"mechanisms_tps"`
	PerSpread  float64 `json:"dlog_tps_dspread"`
	// The drops (absent on the reference run).
	MeasuredDrop   float64 `json:"measured_drop"`
	MechanismsDrop float64 `json:"mechanisms_drop"`
	FittedDrop     float64 `json:"fitted_drop"`
	LeaveOneOut    float64 `json:"leave_one_source_out_drop"`

	measured float64
}

// ScaleSource is one source's estimate and the spread fitted without it.
type ScaleSource struct {
	File        string  `json:"file"`
	Series      int     `json:"series"`
	Estimate    float64 `json:"estimate"`
	LeaveOneOut float64 `json:"fit_without_it"`
}

// scaleKey is what the runs of a scaling series share.
func scaleKey(r published.Run) string {
	fixed := fixedPart(r)
	for _, k := range []string{"gpus", "dp_shard", "dp_replicate", "lbs"} {
		delete(fixed, k)
	}
	return fmt.Sprint(r.File, "|", r.Model, "|", r.GPU, "|", r.Cluster, "|", r.FrameworkVersion, "|", fixed, "|", settingKeys(r))
}

// FitScaleOut finds the scaling series among runs, predicts them without
// a spread between nodes and with a probe of it (predict: the TPS of run r
// at spread s), and fits the spread.
func FitScaleOut(runs []published.Run, predict func(r published.Run, s float64) (float64, error)) (ScaleOut, error) {
	var out ScaleOut
	series, nodes, err := scalingSeries(runs)
	if err != nil {
		return ScaleOut{}, err
	}
	for _, rs := range series {
		s := ScaleSeries{File: rs[0].File, Model: rs[0].Model, GPU: rs[0].GPU}
		for i := range rs {
			r := rs[i]
			t0, err := predict(r, 0)
			if err != nil {
				return ScaleOut{}, fmt.Errorf("scale-out: run %s (%s): %w", r.Label(), r.File, err)
			}
			t1, err := predict(r, spreadProbe)
			if err != nil {
				return ScaleOut{}, fmt.Errorf("scale-out: run %s (%s): %w", r.Label(), r.File, err)
			}
			s.Runs = append(s.Runs, ScaleRun{Name: newTPSRow(r).Name, GPUs: r.GPUs, Nodes: nodes[&rs[i]], Mechanisms: t0,
				PerSpread: (math.Log(t1) - math.Log(t0)) / spreadProbe, measured: r.TPS})
		}
		out.Series = append(out.Series, s)
	}
	out.fit()
	return out, nil
}

// scalingSeries groups runs by scaleKey and keeps the groups spanning two
// or more node counts, each in GPU order, with each run's node count.
func scalingSeries(runs []published.Run) ([][]published.Run, map[*published.Run]int, error) {
	groups := map[string][]published.Run{}
	var order []string
	for _, r := range runs {
		if r.PowerLimited {
			continue
		}
		k := scaleKey(r)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	var out [][]published.Run
	nodes := map[*published.Run]int{}
	for _, k := range order {
		rs := groups[k]
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].GPUs < rs[j].GPUs })
		for i := range rs {
			n, err := nodesOf(rs[i])
			if err != nil {
				return nil, nil, err
			}
			nodes[&rs[i]] = n
		}
		if nodes[&rs[0]] < nodes[&rs[len(rs)-1]] {
			out = append(out, rs)
		}
	}
	return out, nodes, nil
}

// nodesOf is the number of nodes run r spans: its hosts of gpus_per_node,
// or of its cluster's (the default).
func nodesOf(r published.Run) (int, error) {
	per := r.GPUsPerNode
	if per <= 0 {
		_, cl, err := hw.Resolve(r.GPU, r.Cluster)
		if err != nil {
			return 0, fmt.Errorf("scale-out: run %s (%s): %w", r.Label(), r.File, err)
		}
		per = cl.GPUsPerNode
	}
	return (r.GPUs + per - 1) / per, nil
}

// fit estimates each source's spread, the median over sources, and every
// larger run's drops under each.
func (o *ScaleOut) fit() {
	bySource := map[string][]int{} // series indexes per source file
	var files []string
	for i, s := range o.Series {
		if _, ok := bySource[s.File]; !ok {
			files = append(files, s.File)
		}
		bySource[s.File] = append(bySource[s.File], i)
	}
	est := make([]float64, len(files))
	for i, f := range files {
		est[i] = o.estimate(bySource[f])
	}
	o.NodeSpread, o.NodeSpreadSD = fittedSpread(est), sampleSD(est)
	var loo, mech []float64
	for i, f := range files {
		others := slices.Delete(slices.Clone(est), i, i+1)
		without := fittedSpread(others)
		o.Sources = append(o.Sources, ScaleSource{File: f, Series: len(bySource[f]), Estimate: est[i], LeaveOneOut: without})
		for _, si := range bySource[f] {
			runs := o.Series[si].Runs
			for j := 1; j < len(runs); j++ {
				r := &runs[j]
				r.MeasuredDrop = 1 - r.measured/runs[0].measured
				r.MechanismsDrop = predictedDrop(runs[0], *r, 0)
				r.FittedDrop = predictedDrop(runs[0], *r, o.NodeSpread)
				r.LeaveOneOut = predictedDrop(runs[0], *r, without)
				loo = append(loo, r.LeaveOneOut-r.MeasuredDrop)
				mech = append(mech, r.MechanismsDrop-r.MeasuredDrop)
			}
		}
	}
	o.LeaveOneOut, o.Mechanisms = summarize(loo), summarize(mech)
}

// estimate is the least-squares spread of the series idx's larger runs,
// taking ln TPS as linear in s (its slope g at s = 0): the simulator's
// clock loses s·E exactly, ln TPS to within (s·E)²/2, 0.2% of TPS at a
// spread of 2.6% on 64 hosts.
func (o *ScaleOut) estimate(idx []int) float64 {
	var rg, gg float64
	for _, i := range idx {
		runs := o.Series[i].Runs
		for _, r := range runs[1:] {
			res := math.Log(r.measured/runs[0].measured) - math.Log(r.Mechanisms/runs[0].Mechanisms)
			g := r.PerSpread - runs[0].PerSpread
			rg += res * g
			gg += g * g
		}
	}
	if gg == 0 {
		return 0
	}
	return rg / gg
}

// predictedDrop is run's predicted drop from ref at spread s.
func predictedDrop(ref, run ScaleRun, s float64) float64 {
	return 1 - math.Exp(math.Log(run.Mechanisms/ref.Mechanisms)+s*(run.PerSpread-ref.PerSpread))
}

// fittedSpread is the median of the sources' estimates, kept within the
// range a spread may take (hw.MaxSpeedSD), or 0 with fewer than
// minScaleSources of them: the same rule with one source left out.
func fittedSpread(est []float64) float64 {
	if len(est) < minScaleSources {
		return 0
	}
	v := slices.Clone(est)
	slices.Sort(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return math.Max(0, math.Min(hw.MaxSpeedSD, m))
}

// sampleSD is the standard deviation of xs (n − 1), 0 for fewer than two.
func sampleSD(xs []float64) float64 {
	if len(xs) < 2 {
		return 0
	}
	var m, v float64
	for _, x := range xs {
		m += x / float64(len(xs))
	}
	for _, x := range xs {
		v += (x - m) * (x - m)
	}
	return math.Sqrt(v / float64(len(xs)-1))
}

// PredictAtSpread is the uncalibrated TPS of run r with the spread between
// nodes set to s (FitScaleOut's predict for the published runs).
func PredictAtSpread(r published.Run, s float64) (float64, error) {
	in, err := published.InputForRun(r)
	if err != nil {
		return 0, err
	}
	cal := &cost.Calibration{NodeSpread: &s}
	if r.PP > 1 {
		in.Calibration = cal
		res, err := sim.Simulate(in)
		return res.TPS, err
	}
	p, err := sim.Prepare(in)
	if err != nil {
		return 0, err
	}
	res, err := p.Run(cal)
	return res.TPS, err
}
