package validate

import (
	"math"
	"testing"

	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/sim/published"
)

// TestRoutingFitRecoversPlantedSpread: with a simulator whose TPS falls as
// 1/skew, the learned run of a pair measured at 1/LearnedSkew(c) of its
// twin gives back c; a rank overload's estimate predicts its own
// measurement back; the leave-one-out predictions use the other source;
// runs that differ in more than the routing are not its twin.
func TestRoutingFitRecoversPlantedSpread(t *testing.T) {
	runs, err := Published()
	if err != nil {
		t.Fatal(err)
	}
	var bal, learned published.Run
	for _, r := range runs {
		switch r.RunID {
		case "R145":
			bal = r
		case "R145-dropless":
			learned = r
		}
	}
	if bal.RunID == "" || learned.RunID == "" || learned.Routing != job.RoutingLearned {
		t.Fatal("R145 and its learned-routing twin are not among the published runs")
	}
	cfg, err := learned.LoadModel()
	if err != nil {
		t.Fatal(err)
	}
	spec := learned.Spec
	spec.Model = cfg
	const planted = 0.7
	learned.TPS = bal.TPS / spec.LearnedSkew(planted)
	fake := func(_ published.Run, skew float64) (float64, error) { return 1000 / skew, nil }
	// Decoys of the same file that are not its twin: another sequence
	// length, another recipe. Neither pairs with the learned run.
	seq, prec := bal, bal
	seq.Seq *= 2
	prec.Precision = "fp8-current"
	fit, err := FitRouting([]published.Run{bal, seq, prec, learned}, fake)
	if err != nil {
		t.Fatal(err)
	}
	if len(fit.Sources) != len(overloads)+1 {
		t.Fatalf("%d sources, want the %d overloads and the pair", len(fit.Sources), len(overloads))
	}
	pair := fit.Sources[len(fit.Sources)-1]
	if math.Abs(pair.Estimate-planted) > 1e-4 {
		t.Errorf("pair estimate %v, want the planted %v", pair.Estimate, planted)
	}
	for _, o := range overloads {
		if got := o.predict(o.cv()); math.Abs(got-o.learned) > 1e-9 {
			t.Errorf("%s: c = %v predicts %v, want the measured %v", o.source, o.cv(), got, o.learned)
		}
	}
	// One overload and the pair: each predicted from the other's c.
	m := overloads[0]
	if got := *fit.Sources[0].LeaveOneOut; math.Abs(got-m.predict(pair.Estimate)) > 1e-9 {
		t.Errorf("leave-one-out of %s: %v, want its prediction at the pair's c %v", m.source, got, m.predict(pair.Estimate))
	}
	if got, want := *pair.LeaveOneOut, 1/spec.LearnedSkew(m.cv()); math.Abs(got-want) > 1e-9 {
		t.Errorf("leave-one-out of the pair: %v, want the ratio at the overload's c %v", got, want)
	}
}
