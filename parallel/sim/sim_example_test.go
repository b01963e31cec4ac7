package sim_test

import (
	"fmt"
	"math"
	"slices"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
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
	l := moe.Layout{GPUs: 16, EP: 4, Sharding: moe.ShardFSDP, ReshardAfterForward: true}
	if err := l.Resolve(); err != nil {
		panic(err)
	}
	dev, _ := hw.LookupDevice("b200")
	r, err := sim.Simulate(sim.Input{Config: cfg, Layout: l, AC: moe.AC{Mode: moe.ACSelective},
		LBS: 2, Seq: 256, GradAccum: 1, Device: dev})
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Device, r.Cluster, r.TPS > 0, r.MFU > 0 && r.MFU < 1, r.MemoryFraction > 0)
	// Output: b200 hgx true true true
}

// Fit the model to a measured run of your own stack, then predict with it.
func ExampleCalibrate() {
	// A run measured at about 80% of the uncalibrated prediction (28,600).
	measured := sim.Run{Model: "llama3-8b", GPU: "b200", GPUs: 4, DPShard: 4, DPReplicate: 1, EP: 1,
		AC: "none", LBS: 2, Seq: 4096, Precision: "bf16", TPS: 23000}
	cal, err := sim.Calibrate([]sim.Run{measured})
	if err != nil {
		panic(err)
	}
	in, err := sim.InputForRun(measured)
	if err != nil {
		panic(err)
	}
	in.Calibration = cal
	r, err := sim.Simulate(in)
	if err != nil {
		panic(err)
	}
	fmt.Printf("gemm_scale fitted: %v; predicted TPS within 1%%: %v\n", slices.Contains(cal.Fitted, sim.CalGEMM), math.Abs(r.TPS/23000-1) < 0.01)
	// Output: gemm_scale fitted: true; predicted TPS within 1%: true
}
