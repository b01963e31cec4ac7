package memory

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
)

// TestAmaxHistories counts by hand the delayed-scaling state of
// qwen3-30b-a3b (48 MoE blocks, 128 routed experts, no shared experts,
// GQA) at ep 8: per block linear_qkv and linear_proj (2) and 16 local
// experts' fc1 and fc2 (32), 34 GEMMs × 48 = 1632; each keeps 5 FP32
// histories of 1024 steps, 20480 bytes: 33,423,360 bytes, allocated once
// in setup (the count is job.Recipe.DelayedGEMMs', tested there).
func TestAmaxHistories(t *testing.T) {
	cfg, err := hf.Load("qwen3-30b-a3b")
	if err != nil {
		t.Fatal(err)
	}
	r := job.DefaultRecipe()
	r.Precision = job.FP8Delayed
	if err := r.Resolve(); err != nil {
		t.Fatal(err)
	}
	l := job.Layout{GPUs: 8, DPShard: 8, DPReplicate: 1, EP: 8, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	o := OptionsOf(r, moe.AC{Mode: moe.ACFull})
	rep, err := Estimate(cfg, l, Batch{LBS: 1, Seq: 4096, GradAccum: 1}, o)
	if err != nil {
		t.Fatal(err)
	}
	var got int64
	for _, e := range rep.Events {
		if e.Label == "amax_history" && e.Phase == Setup && e.Alloc {
			got += e.Bytes
		}
	}
	if got != 33423360 {
		t.Errorf("amax histories %d bytes in setup, want 33,423,360", got)
	}
}
