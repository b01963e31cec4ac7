package sim

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
)

func benchSimulate(b *testing.B, gpus int) {
	cfg, err := hf.Load("qwen3-30b-a3b")
	if err != nil {
		b.Fatal(err)
	}
	l := job.Layout{GPUs: gpus, DPShard: 64, EP: 8, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	if err := l.Resolve(); err != nil {
		b.Fatal(err)
	}
	in := Input{Spec: job.Spec{Model: cfg, Layout: l, AC: moe.AC{Mode: moe.ACSelective}, Batch: job.Batch{LBS: 2, Seq: 4096, GradAccum: 2}, Recipe: job.EagerRecipe()}}
	for b.Loop() {
		if _, err := Simulate(in); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSimulate512 and 4096: Qwen3-30B-A3B, HSDP dp_shard 64 × ep 8,
// selective AC, lbs 2, seq 4096, 2 micro-steps, B200 hgx.
func BenchmarkSimulate512(b *testing.B)  { benchSimulate(b, 512) }
func BenchmarkSimulate4096(b *testing.B) { benchSimulate(b, 4096) }

// BenchmarkSimulateRun512 and 4096 time the virtual-time part alone (op
// costs, engine, breakdown, memory replay) on a prepared schedule: what
// each calibration evaluation costs.
func benchRun(b *testing.B, gpus int) {
	cfg, err := hf.Load("qwen3-30b-a3b")
	if err != nil {
		b.Fatal(err)
	}
	l := job.Layout{GPUs: gpus, DPShard: 64, EP: 8, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	if err := l.Resolve(); err != nil {
		b.Fatal(err)
	}
	p, err := Prepare(Input{Spec: job.Spec{Model: cfg, Layout: l, AC: moe.AC{Mode: moe.ACSelective}, Batch: job.Batch{LBS: 2, Seq: 4096, GradAccum: 2}, Recipe: job.EagerRecipe()}})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(len(p.sched.Ops)), "ops")
	for b.Loop() {
		if _, err := p.Run(nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSimulateRun512(b *testing.B)  { benchRun(b, 512) }
func BenchmarkSimulateRun4096(b *testing.B) { benchRun(b, 4096) }

// BenchmarkSimulateDense512: Llama-3 8B on 512 ranks (dp_shard 64 ×
// dp_replicate 8), selective AC, lbs 2, seq 8192, whole Simulate.
func BenchmarkSimulateDense512(b *testing.B) {
	cfg, err := hf.Load("llama3-8b")
	if err != nil {
		b.Fatal(err)
	}
	l := job.Layout{GPUs: 512, DPShard: 64, EP: 1, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	if err := l.Resolve(); err != nil {
		b.Fatal(err)
	}
	in := Input{Spec: job.Spec{Model: cfg, Layout: l, AC: moe.AC{Mode: moe.ACSelective}, Batch: job.Batch{LBS: 2, Seq: 8192, GradAccum: 2}, Recipe: job.EagerRecipe()}}
	for b.Loop() {
		if _, err := Simulate(in); err != nil {
			b.Fatal(err)
		}
	}
}
