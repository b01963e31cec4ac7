package sim

import (
	"github.com/moescope/moescope/internal/band"
	"github.com/moescope/moescope/moe/job"
)

// widenForRouter widens the TPS interval of a run with learned routing by
// what the published router statistics leave open: the run simulated with
// the most loaded rank's load at the stored router spread plus and minus
// its standard deviation across sources (band.Stored.RouterCVSD; the
// learned-routing fit in parallel/sim/validate) scales the interval's
// ends. Without an interval, a spread or learned routing it is res.
func widenForRouter(in Input, res Result) (Result, error) {
	st := band.Uncalibrated()
	if in.Routing != job.RoutingLearned || st.RouterCVSD <= 0 || in.SkipInterval || res.TPSInterval == nil || in.Model == nil {
		return res, nil
	}
	at := func(cv float64) (float64, error) {
		probe := in
		probe.Routing, probe.ExpertSkew, probe.SkipInterval = job.RoutingBalanced, in.Spec.LearnedSkew(cv), true
		r, err := simulate(probe)
		return r.TPS, err
	}
	slow, err := at(st.RouterCV + st.RouterCVSD)
	if err != nil {
		return res, err
	}
	fast, err := at(max(st.RouterCV-st.RouterCVSD, 0))
	if err != nil {
		return res, err
	}
	iv := *res.TPSInterval
	res.setIntervals([2]float64{iv[0] * slow / res.TPS, iv[1] * fast / res.TPS}, res.IntervalFrom)
	return res, nil
}
