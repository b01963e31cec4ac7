package validate

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"

	"github.com/moescope/moescope/internal/stats"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/published"
)

// Routing is the learned-routing fit: the spread c of a trained router's
// per-expert load (job.Spec.LearnedSkew's routerCV) estimated from each
// published source that measured a learned router against forced balance,
// their mean (stored with the bands as band.Stored.RouterCV) and, for each
// source, what the others' mean predicts of its measurement.
type Routing struct {
	Sources []RoutingSource `json:"sources"`
	CV      float64         `json:"router_cv"`     // mean of the sources' estimates (0: none)
	CVSD    float64         `json:"router_cv_sd"`  // their standard deviation (0 with one)
	Count   int             `json:"sources_count"` // independent sources (a file's pairs are one)
}

// RoutingSource is one source's estimate and its leave-one-source-out check.
type RoutingSource struct {
	Source   string  `json:"source"`
	What     string  `json:"what"`     // the measured quantity
	Measured float64 `json:"measured"` // its value
	Estimate float64 `json:"estimate"` // the router spread c it implies
	// LeaveOneOut is the quantity predicted at the other sources' mean c
	// (absent with one source), Error its ratio to Measured − 1.
	LeaveOneOut *float64 `json:"leave_one_out,omitempty"`
	Error       *float64 `json:"error,omitempty"`
}

// rankOverload is a published measurement of the most loaded EP rank's
// rows ÷ the mean under forced and under learned routing.
type rankOverload struct {
	source            string
	ep, experts, topK int
	balanced, learned float64
}

// overloads are the published rank overloads (moescope knows no other
// source that publishes the most loaded rank's load itself).
//
// marin-community/marin issue #7668 (comment of 2026-07-28): a 250B-total
// 4-of-128 MoE on 64 GB200s at EP 64, Megatron-Core with HybridEP.
// "Force-balanced traffic held average EP-rank overload near 1.013"; its
// auxiliary-loss-free learned router, "after 18 steps, ... still left
// 1.212 average and 1.724 worst-rank overload" (read: the most loaded
// rank's rows ÷ the mean, averaged over steps, and its worst step). The
// average is the estimate's input; the worst step says how far a step can
// lie from it. The run used mock data and a default bias-update rate the
// thread rejects as too slow: a poorly balanced learned router.
var overloads = []rankOverload{{
	source: "marin-community/marin #7668 (EP 64, 4 of 128 experts, GB200)",
	ep:     64, experts: 128, topK: 4, balanced: 1.013, learned: 1.212,
}}

// overloadCV is the router spread c a rank overload implies beside the
// forced-balance overload of the same run (whose spread is the sampling
// alone: Megatron's forced balance draws random logits): the rank's
// relative standard deviations (overload − 1)/E[max of ep normals], their
// quadratic difference, over √(ep/E) (LearnedSkew's model inverted).
func (o rankOverload) cv() float64 {
	z := stats.ExpectedMaxNormal(o.ep)
	sl, sb := (o.learned-1)/z, (o.balanced-1)/z
	return math.Sqrt(math.Max(sl*sl-sb*sb, 0) / (float64(o.ep) / float64(o.experts)))
}

// predict is the learned overload at router spread c, the measured
// forced-balance spread kept as the sampling's.
func (o rankOverload) predict(c float64) float64 {
	z := stats.ExpectedMaxNormal(o.ep)
	sb := (o.balanced - 1) / z
	return 1 + z*math.Sqrt(c*c*float64(o.ep)/float64(o.experts)+sb*sb)
}

// RoutingPredict is the uncalibrated TPS of run r with its expert skew set
// to skew (balanced routing otherwise): FitRouting's simulator.
type RoutingPredict func(r published.Run, skew float64) (float64, error)

// PredictAtSkew is RoutingPredict on the simulator.
func PredictAtSkew(r published.Run, skew float64) (float64, error) {
	r.Routing, r.ExpertSkew = job.RoutingBalanced, skew
	in, err := published.InputForRun(r)
	if err != nil {
		return 0, err
	}
	in.SkipInterval = true
	res, err := sim.Simulate(in)
	return res.TPS, err
}

// abPair is a published learned-routing run beside its forced-balance twin.
type abPair struct{ balanced, learned published.Run }

// FitRouting estimates the router spread from every source: the rank
// overloads above, and each published run with routing learned whose
// forced-balance twin (the same run with balanced routing) is among runs,
// by the c at which the simulator's TPS ratio of the two equals the
// measured one. The pairs of one document are one source (their median), so
// that a source publishing several rows does not outweigh the others; the
// stored spread is the mean over sources, and each measurement is predicted
// at the mean of the other sources' estimates.
func FitRouting(runs []published.Run, predict RoutingPredict) (Routing, error) {
	var out Routing
	var group []string // each row's source
	var check []func(c float64) (float64, error)
	for _, o := range overloads {
		out.Sources = append(out.Sources, RoutingSource{Source: o.source, What: "most loaded EP rank ÷ mean, learned router", Measured: o.learned, Estimate: o.cv()})
		group = append(group, o.source)
		check = append(check, func(c float64) (float64, error) { return o.predict(c), nil })
	}
	for _, p := range routingPairs(runs) {
		s, err := pairSource(p, predict)
		if err != nil {
			return Routing{}, err
		}
		out.Sources = append(out.Sources, s.RoutingSource)
		group = append(group, sourceDoc(p.learned.Source))
		check = append(check, s.ratio)
	}
	bySource := map[string][]float64{}
	var order []string
	for i, g := range group {
		if _, ok := bySource[g]; !ok {
			order = append(order, g)
		}
		bySource[g] = append(bySource[g], out.Sources[i].Estimate)
	}
	est := map[string]float64{}
	var all []float64
	for _, g := range order {
		est[g] = median(slices.Sorted(slices.Values(bySource[g])))
		all = append(all, est[g])
	}
	out.CV, out.CVSD, out.Count = mean(all), sampleSD(all), len(order)
	for i := range out.Sources {
		var others []float64
		for _, g := range order {
			if g != group[i] {
				others = append(others, est[g])
			}
		}
		if len(others) == 0 {
			continue
		}
		v, err := check[i](mean(others))
		if err != nil {
			return Routing{}, err
		}
		e := v/out.Sources[i].Measured - 1
		out.Sources[i].LeaveOneOut, out.Sources[i].Error = &v, &e
	}
	return out, nil
}

// sourceDoc is the document a run's source names (its address, without
// the parenthesised place in it): rows of one table are one source.
func sourceDoc(src string) string {
	doc, _, _ := strings.Cut(src, " (")
	return doc
}

// routingPairs are the learned-routing runs with their balanced twins: an
// A/B pair (sameSetup) whose settings differ in the routing alone.
func routingPairs(runs []published.Run) []abPair {
	var out []abPair
	for _, l := range runs {
		if l.Routing != job.RoutingLearned {
			continue
		}
		for _, b := range runs {
			if b.Routing == job.RoutingLearned || !sameSetup(b, l) {
				continue
			}
			bl := l
			bl.Routing = b.Routing
			if reflect.DeepEqual(settingKeys(b), settingKeys(bl)) {
				out = append(out, abPair{balanced: b, learned: l})
			}
		}
	}
	return out
}

// pairSourceFit is a pair's estimate with the ratio it predicts at any c.
type pairSourceFit struct {
	RoutingSource
	ratio func(c float64) (float64, error)
}

// pairSource finds, by bisection, the router spread at which the
// predicted learned ÷ balanced TPS equals the measured ratio (the skew,
// and with it the ratio, is monotone in c).
func pairSource(p abPair, predict RoutingPredict) (pairSourceFit, error) {
	cfg, err := p.learned.LoadModel()
	if err != nil {
		return pairSourceFit{}, err
	}
	spec := p.learned.Spec
	spec.Model = cfg
	base, err := predict(p.balanced, 1)
	if err != nil {
		return pairSourceFit{}, err
	}
	ratio := func(c float64) (float64, error) {
		v, err := predict(p.learned, spec.LearnedSkew(c))
		return v / base, err
	}
	want := p.learned.TPS / p.balanced.TPS
	lo, hi := 0.0, 4.0
	if r, err := ratio(hi); err != nil || r > want {
		return pairSourceFit{}, errors.Join(err, fmt.Errorf("routing: run %s: no router spread up to %v gives the measured ratio %.3f", p.learned.Label(), hi, want))
	}
	for range 20 {
		mid := (lo + hi) / 2
		r, err := ratio(mid)
		if err != nil {
			return pairSourceFit{}, err
		}
		if r > want {
			lo = mid
		} else {
			hi = mid
		}
	}
	src := RoutingSource{Source: p.learned.Source, What: fmt.Sprintf("TPS learned ÷ forced balance, run %s", p.learned.Label()), Measured: want, Estimate: (lo + hi) / 2}
	return pairSourceFit{RoutingSource: src, ratio: ratio}, nil
}

// mean of xs (0 for none).
func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(max(len(xs), 1))
}

// writeRouting prints the learned-routing fit: each source's measurement,
// the router spread it implies and what the other sources' mean predicts.
func writeRouting(b *strings.Builder, r Routing) {
	if len(r.Sources) == 0 {
		return
	}
	b.WriteString("\nlearned routing: the spread c of a trained router's per-expert load each source implies (the most loaded EP rank lies\n" +
		"E[max of ep normals]·√(c²·ep/E + sampling) above the mean), and its measurement predicted at the other sources' mean c\n")
	for _, s := range r.Sources {
		fmt.Fprintf(b, "%s\n  %s: measured %.3f, c = %.3f", s.Source, s.What, s.Measured, s.Estimate)
		if s.LeaveOneOut != nil {
			fmt.Fprintf(b, "; without it %.3f (%+.1f%%)", *s.LeaveOneOut, 100**s.Error)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(b, "router spread c: %.3f (mean of %d sources' estimates, a source's pairs by their median; standard deviation %.3f: the interval of a learned-routing prediction spans c ± that)\n",
		r.CV, r.Count, r.CVSD)
}
