package plan

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/published"
)

// TestPlanPublishedReport prints, for every published run in
// parallel/sim/validate/testdata/published/, the measured TPS of the published layout next to
// the modelled TPS of that layout and of the plan the search prefers on the
// same model, GPU type, GPU count and sequence length. It is a report, not
// a pass/fail check, and a slow one (a full search per run), so it runs
// only when MOESCOPE_PLAN_PUBLISHED=1:
//
//	MOESCOPE_PLAN_PUBLISHED=1 go test ./parallel -run PlanPublishedReport -v
func TestPlanPublishedReport(t *testing.T) {
	if os.Getenv("MOESCOPE_PLAN_PUBLISHED") != "1" {
		t.Skip("set MOESCOPE_PLAN_PUBLISHED=1 to print the published-runs report (one full search per run)")
	}
	runs, err := published.Load("../sim/validate/testdata/published")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	// vs meas: the preferred plan's modelled TPS over the published run's
	// measured TPS; vs model: over the published layout's modelled TPS
	// (what the search gains, by the model's own account).
	fmt.Fprintf(&b, "\nmemory target 0.92, uncalibrated\n%-16s %-5s %4s %5s %-34s %9s %9s | %-44s %9s %7s %8s %5s\n", "model", "gpu", "gpus", "seq", "published layout", "measured", "modelled",
		"preferred plan", "modelled", "vs meas", "vs model", "sims")
	for _, r := range runs {
		if r.PowerLimited {
			fmt.Fprintf(&b, "%-16s %-5s %4d %5d skipped: its GPUs' power limit is not stated (power_limited)\n", r.Model, r.GPU, r.GPUs, r.Seq)
			continue
		}
		in, err := published.InputForRun(r)
		if err != nil {
			t.Errorf("%s: %v", r.File, err)
			continue
		}
		pub, err := sim.Simulate(in)
		if err != nil {
			t.Errorf("%s: %v", r.File, err)
			continue
		}
		cl := in.Cluster
		if r.GPUsPerNode > 0 {
			c := cl.WithGPUsPerNode(r.GPUsPerNode)
			cl = &c
		}
		ev := &SimEvaluator{Run: eagerRun(in.Model, r.Seq), Device: in.Device, Cluster: cl}
		req := Request{GPUs: r.GPUs, GPUsPerNode: cl.GPUsPerNode, MemoryTarget: 0.92}
		if in.Model.IsMoE() {
			req.Experts = in.Model.Experts
		}
		pref := "no feasible plan"
		var tps float64
		sims := 0
		if rep, err := Search(req, ev); err == nil {
			p := rep.Best.Point
			l := p.Layout
			pref = fmt.Sprintf("%s %d×%d ep%d %s lbs%d", l.Sharding, l.DPShard, l.DPReplicate, l.EP, p.AC, p.LBS)
			if !l.ReshardAfterForward {
				pref += " no-reshard"
			}
			tps, sims = rep.Best.Score.TPS, rep.Simulated
		} else {
			t.Logf("%s: %v", r.File, err)
		}
		name := r.Model
		if i := strings.LastIndex(name, "/"); i >= 0 {
			name = name[i+1:]
		}
		pl := in.Layout
		pubDesc := fmt.Sprintf("%d×%d ep%d %s lbs%d", pl.DPShard, pl.DPReplicate, pl.EP, r.AC, r.LBS)
		if r.Compile {
			pubDesc += " compiled"
		}
		if tps == 0 {
			fmt.Fprintf(&b, "%-16s %-5s %4d %5d %-34s %9.0f %9.0f | %-44s %9s %7s %8s %5d\n", name, r.GPU, r.GPUs, r.Seq, pubDesc, r.TPS, pub.TPS,
				pref, "-", "-", "-", sims)
			continue
		}
		fmt.Fprintf(&b, "%-16s %-5s %4d %5d %-34s %9.0f %9.0f | %-44s %9.0f %+6.0f%% %+7.1f%% %5d\n", name, r.GPU, r.GPUs, r.Seq, pubDesc, r.TPS, pub.TPS,
			pref, tps, 100*(tps/r.TPS-1), 100*(tps/pub.TPS-1), sims)
	}
	t.Log(b.String())
}
