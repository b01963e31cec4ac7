package parallel

import (
	"testing"

	"github.com/moescope/moescope/moe"
)

func BenchmarkPlanSimMemory(b *testing.B) {
	cfg, err := moe.Load("qwen3-30b-a3b")
	if err != nil {
		b.Fatal(err)
	}
	dev, err := LookupDevice("b200")
	if err != nil {
		b.Fatal(err)
	}
	p := PlanPoint{Layout: moe.Layout{GPUs: 512, DPShard: 64, DPReplicate: 8, EP: 8, Sharding: moe.ShardFSDP, ReshardAfterForward: true}, AC: moe.AC{Mode: moe.ACSelective}, LBS: 2, GradAccum: 1}
	for b.Loop() {
		e := &PlanSim{Model: cfg, Device: dev, Seq: 4096} // fresh: no cached results
		if _, err := e.MemoryFraction(p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlanSimEvaluate(b *testing.B) {
	cfg, err := moe.Load("qwen3-30b-a3b")
	if err != nil {
		b.Fatal(err)
	}
	dev, err := LookupDevice("b200")
	if err != nil {
		b.Fatal(err)
	}
	p := PlanPoint{Layout: moe.Layout{GPUs: 512, DPShard: 64, DPReplicate: 8, EP: 8, Sharding: moe.ShardFSDP, ReshardAfterForward: true}, AC: moe.AC{Mode: moe.ACSelective}, LBS: 2, GradAccum: 1}
	for b.Loop() {
		e := &PlanSim{Model: cfg, Device: dev, Seq: 4096} // fresh: no cached results
		if _, err := e.Evaluate(p); err != nil {
			b.Fatal(err)
		}
	}
}
