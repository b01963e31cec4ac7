package sim_test

import (
	"fmt"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim"
)

// Predict one layout: a small MoE on 16 B200s (two hgx hosts), FSDP over
// all 16 with expert parallelism 4, per-op selective checkpointing.
func ExampleSimulate() {
	cfg, err := hf.Load("tiny")
	if err != nil {
		panic(err)
	}
	l := job.Layout{GPUs: 16, EP: 4, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	if err := l.Resolve(); err != nil {
		panic(err)
	}
	dev, _ := hw.LookupDevice("b200")
	r, err := sim.Simulate(sim.Input{Spec: job.Spec{Model: cfg, Layout: l, AC: moe.AC{Mode: moe.ACSelective}, Batch: job.Batch{LBS: 2, Seq: 256, GradAccum: 1}, Recipe: job.EagerRecipe()}, Device: dev})
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Device, r.Cluster, r.TPS > 0, r.MFU > 0 && r.MFU < 1, r.MemoryFraction > 0)
	// Output: b200 hgx true true true
}
