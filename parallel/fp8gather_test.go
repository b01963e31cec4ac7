package parallel

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// TestFP8GatherBytes: with torchao's fp8 all-gather a block's gather moves
// its linear weights in one byte. A dense model of hidden 32, 4 heads and 2
// KV heads of 8, FFN 64 has, per block, q 1024 + k 512 + v 512 + o 1024 +
// MLP 6144 = 9216 linear elements and two norms of 32 (by hand); over 8
// shard ranks nothing is padded (every dim 0 divides by 8), so the gather
// is 9280 elements, 9216 of them fp8: 9216 + 2·64 = 9344 bytes, against
// 18560 in bf16.
func TestFP8GatherBytes(t *testing.T) {
	cfg := &moe.Config{Name: "dense", ModelType: "llama", Vocab: 64, Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8,
		DenseFFN: 64, MoELayer: []bool{false, false}, Window: []int{0, 0}, QKNorm: moe.QKNormNone,
		RotaryFraction: 1, RopeTheta: 10000, NormEps: 1e-6, InitRange: 0.02}
	l := job.Layout{GPUs: 8, DPShard: 8, DPReplicate: 1, EP: 1, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	m, err := NewMesh(l, cfg, 8)
	if err != nil {
		t.Fatal(err)
	}
	gather := func(r job.Recipe) ScheduleOp {
		t.Helper()
		if err := r.Resolve(); err != nil {
			t.Fatal(err)
		}
		s, err := BuildSchedule(ScheduleSpec{Spec: job.Spec{Model: cfg, Batch: job.Batch{LBS: 1, Seq: 16, GradAccum: 1}, Recipe: r}, Mesh: m})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range s.Ops {
			if o.Purpose == PurposeGather && o.Layer == 0 {
				return o
			}
		}
		t.Fatal("no gather of block 0")
		return ScheduleOp{}
	}
	r := job.DefaultRecipe()
	r.Precision, r.FP8AllGather = job.FP8Tensorwise, true
	if o := gather(r); o.Elements != 9280 || o.FP8Elements != 9216 || o.Bytes() != 9344 {
		t.Errorf("fp8 all-gather: %d elements, %d fp8, %d B; want 9280, 9216, 9344", o.Elements, o.FP8Elements, o.Bytes())
	}
	if o := gather(job.DefaultRecipe()); o.FP8Elements != 0 || o.Bytes() != 18560 {
		t.Errorf("bf16: %d fp8, %d B; want 0, 18560", o.FP8Elements, o.Bytes())
	}
}
