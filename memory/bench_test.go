package memory_test

import (
	"testing"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
)

// BenchmarkEstimatePipeline is the pipeline estimate the planner sizes
// most: Qwen3-235B-A22B on 256 GPUs, pp 8 Interleaved1F1B with 2 stages per
// rank, 256 micro-batches of one sequence, full checkpointing.
func BenchmarkEstimatePipeline(b *testing.B) {
	cfg, err := hf.Load("qwen3-235b-a22b")
	if err != nil {
		b.Fatal(err)
	}
	l := job.Layout{GPUs: 256, PP: 8, DPShard: 32, DPReplicate: 1, EP: 8, Sharding: job.ShardFSDP,
		PPSchedule: job.PPInterleaved1F1B, PPMicrobatchSize: 1, PPVirtualStages: 2}
	for b.Loop() {
		if _, err := memory.Estimate(cfg, l, memory.Batch{LBS: 256, Seq: 4096}, memory.Options{AC: moe.AC{Mode: moe.ACFull}}); err != nil {
			b.Fatal(err)
		}
	}
}
