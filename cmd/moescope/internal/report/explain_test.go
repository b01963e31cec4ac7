package report

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/plan"
	"github.com/moescope/moescope/parallel/sim"
)

// TestExplain: the two lines for a hand-built best plan, fsdp 8 × 2
// replicas at lbs 4 × 2 micro-steps: its step of 2 s splits 1.5 s compute
// (75%), 0.4 s recompute (20%), 0.1 s exposed all-gather (5%) and 5 ms of
// optimizer (0.25%, which rounds to 0% and is left out); the runner-up at
// 900 TPS is 1 − 900/1000 = 10.0% slower, one at 1000 ties.
func TestExplain(t *testing.T) {
	l := job.Layout{GPUs: 16, DPReplicate: 2, EP: 1, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	best := plan.Result{Point: plan.Point{Layout: l, AC: moe.AC{Mode: moe.ACSelective}, LBS: 4, GradAccum: 2},
		Score: plan.Score{TPS: 1000, MFU: 0.4, MemoryFraction: 0.5, StepTimeS: 2, Bottleneck: "compute",
			Breakdown: sim.Breakdown{ComputeS: 1.5, RecomputeS: 0.4, OptimizerS: 0.005, ExposedCommS: map[string]float64{"all_gather": 0.1}}}}
	next := plan.Result{Point: plan.Point{Layout: l, AC: moe.AC{Mode: moe.ACFull}, LBS: 2, GradAccum: 4}, Score: plan.Score{TPS: 900}}
	dev := hw.Device{MemoryBytes: 80 << 30}
	got := Explain(&plan.Report{Best: best, Plans: []plan.Result{best, next}}, dev)
	want := [2]string{
		"best: fsdp groups of 8 GPUs × 2 replicas (reshard), per-op selective activation checkpointing, lbs 4 × 2 micro-steps: 1000 TPS per GPU, MFU 40.0%, memory 50.0% of 80.00 GiB.",
		"why: step 2.000 s = compute 75% + recompute 20% + exposed all_gather 5%; bottleneck compute; the runner-up (fsdp 8×2 ep 1 reshard, full, lbs 2) is 10.0% slower.",
	}
	if got != want {
		t.Errorf("Explain =\n%q\n%q\nwant\n%q\n%q", got[0], got[1], want[0], want[1])
	}
	next.Score.TPS = 1000
	got = Explain(&plan.Report{Best: best, Plans: []plan.Result{best, next}}, dev)
	if w := "bottleneck compute; it ties with fsdp 8×2 ep 1 reshard, full, lbs 2 (lower memory breaks the tie)."; got[1][len(got[1])-len(w):] != w {
		t.Errorf("tie: %q, want it to end %q", got[1], w)
	}
}

// TestACProse: each checkpointing policy in a sentence.
func TestACProse(t *testing.T) {
	for in, want := range map[string]string{
		"none":                  "no activation checkpointing",
		"selective":             "per-op selective activation checkpointing",
		"full":                  "full activation checkpointing",
		"layer:3":               "full checkpointing of every 3-th block",
		"modules:layernorm,moe": "Megatron-style recompute of layernorm,moe",
	} {
		ac, err := moe.ParseAC(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := acProse(ac); got != want {
			t.Errorf("%s: %q, want %q", in, got, want)
		}
	}
}
