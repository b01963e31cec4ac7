package memory_test

import (
	"testing"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
)

// TestSetupBytes: the bound equals the setup events' bytes of the
// timeline (one rank without pipelining; the reported worst rank's at
// most, under pp) and never exceeds the peak reserved, for several
// layouts, policies and options.
func TestSetupBytes(t *testing.T) {
	small, big := builtinModel(t, "qwen3-30b-a3b"), builtinModel(t, "qwen3-235b-a22b")
	zero1 := job.Layout{GPUs: 16, DPShard: 8, DPReplicate: 2, EP: 4, Sharding: job.ShardZeRO1}
	ddp := job.Layout{GPUs: 4, DPShard: 4, DPReplicate: 1, EP: 4, Sharding: job.ShardDDP}
	fsdp := job.Layout{GPUs: 8, DPShard: 8, DPReplicate: 1, EP: 8, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	pipe := job.Layout{GPUs: 32, PP: 4, DPShard: 8, DPReplicate: 1, EP: 8, Sharding: job.ShardFSDP,
		PPSchedule: job.PPInterleaved1F1B, PPMicrobatchSize: 1, PPVirtualStages: 2}
	for _, c := range []struct {
		cfg *moe.Config
		l   job.Layout
		lbs int
		o   memory.Options
	}{
		{small, fsdp, 2, memory.Options{AC: moe.AC{Mode: moe.ACSelective}}},
		{small, zero1, 1, memory.Options{AC: moe.AC{Mode: moe.ACFull}, Master: moe.F32, Precision: moe.Precision{Param: moe.BF16, Compute: moe.BF16, Grad: moe.BF16, Optimizer: moe.F32, Activation: moe.BF16}}},
		{small, ddp, 1, memory.Options{}},
		{big, pipe, 8, memory.Options{AC: moe.AC{Mode: moe.ACFull}}},
	} {
		floor, err := memory.SetupBytes(c.cfg, c.l, c.o)
		if err != nil {
			t.Fatal(err)
		}
		r, err := memory.Estimate(c.cfg, c.l, memory.Batch{LBS: c.lbs, Seq: 4096}, c.o)
		if err != nil {
			t.Fatal(err)
		}
		var setup int64
		for _, e := range r.Events {
			if e.Phase == memory.Setup && (e.Label == "parameters" || e.Label == "optimizer_state") {
				setup += e.Bytes
			}
		}
		if c.l.Stages() == 1 && floor != setup || c.l.Stages() > 1 && floor < setup {
			t.Errorf("%+v: SetupBytes %d, the timeline's parameters and optimizer state %d", c.l, floor, setup)
		}
		if floor <= 0 || floor > r.Peak.Reserved {
			t.Errorf("%+v: SetupBytes %d not in (0, peak reserved %d]", c.l, floor, r.Peak.Reserved)
		}
		for _, s := range r.Stages {
			if floor > s.PeakReservedBytes && s.Rank == r.Stage {
				t.Errorf("%+v: bound %d above the worst rank's %d", c.l, floor, s.PeakReservedBytes)
			}
		}
	}
}

// builtinModel loads a built-in model for a test.
func builtinModel(t *testing.T, name string) *moe.Config {
	t.Helper()
	cfg, err := hf.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
