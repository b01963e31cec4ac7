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
// 900 TPS is 1 − 900/1000 = 10.0% slower, one at 1000 ties. Its step takes
// 4 × 16 ranks × 2 = 128 sequences of 4096 tokens = 524,288 tokens (524.3K).
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
	got := Explain(&plan.Report{Best: best, Plans: []plan.Result{best, next}}, dev, 4096)
	want := [2]string{
		"best: fsdp groups of 8 GPUs × 2 replicas (reshard), per-op selective activation checkpointing, lbs 4 × 2 micro-steps (global batch 128 sequences, 524.3K tokens per step): 1000 TPS per GPU, MFU 40.0%, memory 50.0% of 80.00 GiB.",
		"why: step 2.000 s = compute 75% + recompute 20% + exposed all_gather 5%; bottleneck compute; the runner-up (fsdp 8×2 ep 1 reshard, full, lbs 2) is 10.0% slower.",
	}
	if got != want {
		t.Errorf("Explain =\n%q\n%q\nwant\n%q\n%q", got[0], got[1], want[0], want[1])
	}
	next.Score.TPS = 1000
	got = Explain(&plan.Report{Best: best, Plans: []plan.Result{best, next}}, dev, 4096)
	if w := "bottleneck compute; it ties with fsdp 8×2 ep 1 reshard, full, lbs 2 (lower memory breaks the tie)."; got[1][len(got[1])-len(w):] != w {
		t.Errorf("tie: %q, want it to end %q", got[1], w)
	}
}

// TestBatchNote: the note for a free batch names the best plan's
// sequences and tokens per step: 8 × 64 ranks × 1 = 512 sequences of 4096
// tokens = 2,097,152 tokens (2.1M).
func TestBatchNote(t *testing.T) {
	l := job.Layout{GPUs: 64, DPReplicate: 8, EP: 1, Sharding: job.ShardFSDP}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	rep := &plan.Report{Best: plan.Result{Point: plan.Point{Layout: l, AC: moe.AC{Mode: moe.ACNone}, LBS: 8, GradAccum: 1}}}
	want := "the best plan steps 512 sequences (2.1M tokens) per step; set --global-batch to hold the batch your recipe trains with."
	if got := BatchNote(rep, 4096); got != want {
		t.Errorf("BatchNote = %q, want %q", got, want)
	}
}

// TestTokens: exact below 10,000, then K, M, B to one decimal, each unit
// taking over where the one below would round to 1000.0.
func TestTokens(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 512: "512", 9999: "9999", 10_000: "10.0K", 524_288: "524.3K", 999_949: "999.9K",
		999_950: "1.0M", 2_097_152: "2.1M", 50_331_648: "50.3M", 999_950_000: "1.0B", 4_398_046_511_104: "4398.0B"} {
		if got := Tokens(n); got != want {
			t.Errorf("Tokens(%d) = %q, want %q", n, got, want)
		}
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
