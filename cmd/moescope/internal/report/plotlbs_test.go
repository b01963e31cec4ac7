package report

import (
	"slices"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/plan"
)

// sweepFake is a closed-form evaluator: memory 0.25 + perSeq·lbs of the
// device, perSeq 0.05 without checkpointing, 0.025 under selective and
// 0.005 under full; TPS 40,000·lbs / (lbs + 2) per GPU. Like the
// simulator's memory estimate, it refuses a local batch the layout's
// pipeline schedule does not run.
type sweepFake struct{}

func (sweepFake) MemoryFraction(p plan.Point) (float64, error) {
	if _, err := p.Layout.Microbatches(p.LBS); err != nil {
		return 0, err
	}
	perSeq := map[moe.ACMode]float64{moe.ACNone: 0.05, moe.ACSelective: 0.025, moe.ACFull: 0.005}[p.AC.Mode]
	return 0.25 + perSeq*float64(p.LBS), nil
}

func (f sweepFake) Evaluate(p plan.Point) (plan.Score, error) {
	m, err := f.MemoryFraction(p)
	return plan.Score{TPS: 40000 * float64(p.LBS) / float64(p.LBS+2), MemoryFraction: m}, err
}

// TestTargetSweeps: the local-batch sweeps are at the target scale and
// stop at the largest lbs within the memory target. With the fake's
// memory 0.25 + perSeq·lbs and a target of 0.92, by hand: lbs ≤ 0.67 /
// perSeq, so 13 without checkpointing, 26 under selective and 134 under
// full (each below --max-lbs 256, so the target ends the sweep).
func TestTargetSweeps(t *testing.T) {
	l := job.Layout{GPUs: 64, DPShard: 64, DPReplicate: 1, EP: 1, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	best := plan.Result{Point: plan.Point{Layout: l, AC: moe.AC{Mode: moe.ACSelective}, LBS: 4, GradAccum: 1}}
	rep := &plan.Report{Best: best, Plans: []plan.Result{best}}
	sweeps, err := TargetSweeps(sweepFake{}, rep, 0.92, 256, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[moe.ACMode]int{moe.ACNone: 13, moe.ACSelective: 26, moe.ACFull: 134}
	if len(sweeps) != len(want) {
		t.Fatalf("%d sweeps, want one per policy (none, selective, full)", len(sweeps))
	}
	for _, sw := range sweeps {
		if n := len(sw.Points); n != want[sw.AC.Mode] {
			t.Errorf("%s: sweep ends at lbs %d, want %d", sw.AC, n, want[sw.AC.Mode])
		}
		for i, r := range sw.Points {
			if r.Point.Layout.GPUs != 64 || r.Point.LBS != i+1 || r.Point.GradAccum != 1 {
				t.Errorf("%s point %d: %d GPUs lbs %d accum %d, want 64 GPUs lbs %d accum 1", sw.AC, i, r.Point.Layout.GPUs, r.Point.LBS, r.Point.GradAccum, i+1)
			}
		}
	}
	// A global batch keeps only the local batches that divide it: 384
	// sequences over 64 ranks are 6 per rank, so lbs 1, 2, 3 and 6 with 6,
	// 3, 2 and 1 micro-steps.
	sweeps, err = TargetSweeps(sweepFake{}, rep, 0.92, 256, 64*6, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, sw := range sweeps {
		var got []int
		for _, r := range sw.Points {
			got = append(got, r.Point.LBS)
			if p := r.Point; p.LBS*64*p.GradAccum != 384 {
				t.Errorf("%s lbs %d × 64 × accum %d ≠ 384", sw.AC, p.LBS, p.GradAccum)
			}
		}
		if want := []int{1, 2, 3, 6}; !slices.Equal(got, want) {
			t.Errorf("%s: swept lbs %v, want %v", sw.AC, got, want)
		}
	}
}

// TestTargetSweepsPipeline: a pipeline's sweep holds only the local
// batches its schedule accepts. DualPipeV at pp 2 with micro-batches of 2
// sequences needs at least 2·pp = 4 micro-batches (PyTorch's
// ScheduleDualPipeV), so by hand lbs 8, 10, 12, … (a whole number of
// micro-batches): 1 to 7 and the odd ones are skipped, not an error.
func TestTargetSweepsPipeline(t *testing.T) {
	l := job.Layout{GPUs: 64, PP: 2, DPShard: 32, DPReplicate: 1, EP: 1, Sharding: job.ShardFSDP,
		PPSchedule: job.PPDualPipeV, PPVirtualStages: 2, PPMicrobatchSize: 2}
	best := plan.Result{Point: plan.Point{Layout: l, AC: moe.AC{Mode: moe.ACFull}, LBS: 8, GradAccum: 1}}
	rep := &plan.Report{Best: best, Plans: []plan.Result{best}}
	sweeps, err := TargetSweeps(sweepFake{}, rep, 0.92, 20, 0, []moe.AC{{Mode: moe.ACFull}})
	if err != nil {
		t.Fatal(err)
	}
	if len(sweeps) != 1 {
		t.Fatalf("%d sweeps, want 1 (full)", len(sweeps))
	}
	var got []int
	for _, r := range sweeps[0].Points {
		got = append(got, r.Point.LBS)
	}
	if want := []int{8, 10, 12, 14, 16, 18, 20}; !slices.Equal(got, want) {
		t.Errorf("swept lbs %v, want %v", got, want)
	}
}
