package memory_test

import (
	"fmt"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
)

// Estimate sizes one rank of Qwen3-30B-A3B on 64 GPUs (FSDP over 64,
// experts over ep = 8) at 2 sequences of 4096 tokens, per-op SAC. By hand:
// state 30.53e9 · 16 B / 64 = 7.11 GiB; block 0 keeps per token its input
// 2D, q 2q, v 2kv, attention output 2q and lse 4H, top-k values and
// indices 12K and the two all-to-all outputs 4KD = 87,264 B, × 8192 tokens
// = 0.67 GiB; with 48 blocks, the loss (≈ 4·T·V·4 B = 18.5 GiB at its
// peak) and buffers, well under 0.92 × 178.35 GiB. The zero Options are
// eager PyTorch; the command line compiles by default (job.DefaultRecipe),
// whose options are memory.OptionsOf(job.DefaultRecipe(), ac): compiled
// blocks and loss keep fewer tensors (the seed's 512-GPU layout, 4 × 128,
// lbs 22, per-op SAC, is 156.3% of a B200 eager and 83.3% compiled:
// moescope memory … --compile=false and without).
func ExampleEstimate() {
	cfg, err := hf.Load("qwen3-30b-a3b")
	if err != nil {
		panic(err)
	}
	l := job.Layout{GPUs: 64, DPShard: 64, DPReplicate: 1, EP: 8, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	r, err := memory.Estimate(cfg, l, memory.Batch{LBS: 2, Seq: 4096}, memory.Options{AC: moe.AC{Mode: moe.ACSelective}})
	if err != nil {
		panic(err)
	}
	gib := func(n int64) float64 { return float64(n) / (1 << 30) }
	fmt.Printf("state %.2f GiB (16 B per sharded parameter)\n", gib(r.State.Total()))
	fmt.Printf("saved activations of block 0: %.2f GiB\n", gib(r.Saved[1]))
	b200 := 178.35 * (1 << 30) // total_memory as PyTorch reports it, bytes
	fmt.Printf("fits 92%% of a B200: %v\n", float64(r.Peak.Reserved) <= 0.92*b200)
	// Output:
	// state 7.11 GiB (16 B per sharded parameter)
	// saved activations of block 0: 0.67 GiB
	// fits 92% of a B200: true
}
