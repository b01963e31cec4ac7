package validate

import (
	"fmt"
	"math"
	"testing"

	"github.com/moescope/moescope/parallel/sim/cost"
	"github.com/moescope/moescope/parallel/sim/published"
)

// scaleRun is a run of source file at gpus GPUs on hosts of 8, measuring
// tps.
func scaleRun(file string, gpus int, tps float64) published.Run {
	r := published.Run{Model: "m", GPU: "b200", TPS: tps, Precision: "bf16"}
	r.File, r.GPUs, r.DPShard, r.DPReplicate, r.GPUsPerNode, r.LBS, r.Seq = file, gpus, gpus, 1, 8, 2, 4096
	return r
}

// TestFitScaleOutRecoversPlantedSpreads: runs whose measured TPS is the
// mechanisms' prediction × exp(−s·E[max of nodes]) for a spread s planted
// per source, predicted by a stand-in with the same dependence on s, give
// back each source's s (the least-squares estimate is exact when ln TPS
// is linear in s, as the fit assumes; the simulator's 1 − s·E is to within
// (s·E)²/2), their median and their standard deviation
// (sources 1%, 2%, 5%: median 2%, sd √(((1−8/3)² + (2−8/3)² + (5−8/3)²)/2)
// = 2.0817%). With one source left out two remain, fewer than the fit
// needs: each source's leave-one-out drop is the mechanisms'.
func TestFitScaleOutRecoversPlantedSpreads(t *testing.T) {
	const base = 1000.0
	loss := func(s float64, gpus int) float64 { return math.Exp(-cost.NodeSpreadLoss(s, (gpus+7)/8)) }
	planted := map[string]float64{"a.json": 0.01, "b.json": 0.02, "c.json": 0.05}
	var runs []published.Run
	for _, f := range []string{"a.json", "b.json", "c.json"} {
		for _, g := range []int{8, 64, 512} {
			runs = append(runs, scaleRun(f, g, base*loss(planted[f], g)))
		}
	}
	// Not a scaling series: one node only.
	runs = append(runs, scaleRun("d.json", 2, 900), scaleRun("d.json", 8, 800))
	predict := func(r published.Run, s float64) (float64, error) { return base * loss(s, r.GPUs), nil }
	o, err := FitScaleOut(runs, predict)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Series) != 3 || len(o.Sources) != 3 {
		t.Fatalf("%d series of %d sources, want 3 of 3 (d.json spans one node)", len(o.Series), len(o.Sources))
	}
	for _, src := range o.Sources {
		if math.Abs(src.Estimate-planted[src.File]) > 1e-6 {
			t.Errorf("source %s: estimate %.6f, want %.6f", src.File, src.Estimate, planted[src.File])
		}
		if src.LeaveOneOut != 0 {
			t.Errorf("source %s: fit without it %v, want 0 (two sources left)", src.File, src.LeaveOneOut)
		}
	}
	if math.Abs(o.NodeSpread-0.02) > 1e-6 || math.Abs(o.NodeSpreadSD-0.020817) > 1e-6 {
		t.Errorf("spread %.6f ± %.6f, want 0.020000 ± 0.020817", o.NodeSpread, o.NodeSpreadSD)
	}
	for _, s := range o.Series {
		last := s.Runs[len(s.Runs)-1]
		want := 1 - loss(planted[s.File], 512)/loss(planted[s.File], 8)
		if math.Abs(last.MeasuredDrop-want) > 1e-9 || last.MechanismsDrop != 0 || last.LeaveOneOut != 0 {
			t.Errorf("%s at 512: measured drop %.6f (want %.6f), mechanisms %v and leave-one-out %v (want 0)",
				s.File, last.MeasuredDrop, want, last.MechanismsDrop, last.LeaveOneOut)
		}
	}
}

// TestFitScaleOutNeedsThreeSources: two sources fit nothing (the issue's
// rule: fewer than three independent series, the mechanisms alone).
func TestFitScaleOutNeedsThreeSources(t *testing.T) {
	var runs []published.Run
	for i, f := range []string{"a.json", "b.json"} {
		runs = append(runs, scaleRun(f, 8, 1000), scaleRun(f, 64, 950-float64(10*i)))
	}
	o, err := FitScaleOut(runs, func(published.Run, float64) (float64, error) { return 1000, nil })
	if err != nil {
		t.Fatal(err)
	}
	if o.NodeSpread != 0 || len(o.Sources) != 2 {
		t.Errorf("spread %v from %d sources, want 0 from 2", o.NodeSpread, len(o.Sources))
	}
	if _, err := FitScaleOut(runs, func(published.Run, float64) (float64, error) { return 0, fmt.Errorf("boom") }); err == nil {
		t.Error("a prediction that fails: no error")
	}
}
