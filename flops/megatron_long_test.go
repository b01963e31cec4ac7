package flops

import (
	"testing"

	"github.com/moescope/moescope/moe/hf"
)

// TestMegatronQwen3235BLongContext works Megatron-LM's
// num_floating_point_operations (megatron/training/training.py,
// transformer_flops, Megatron-LM d98e8a6) by hand for Qwen3-235B-A22B at
// seq 16384, the published run R145's convention (its tokens/s is 295e12
// over this count): 94 MoE layers, hidden 4096, q = 64·128 = 8192,
// kv = 4·128 = 512, experts of 1536, top 8, no dense layer or shared
// expert, no attention output gate (qk-norm is not counted), vocabulary
// 151936, a multiple of both 128 and the ModelZoo's
// make_vocab_size_divisible_by 1187 × TP 4 = 4748. Per token:
//
//	experts  6·4096·3·1536·8·94               = 85161148416
//	attn     94·6·(4096·(8192+2·512) + 8192·4096) = 40214986752
//	logits   6·4096·151936                    =  3733979136
//	core     16384·94·6·8192 (causal: 6·q/2·2) = 75698798592
//	total                                     = 204808912896
func TestMegatronQwen3235BLongContext(t *testing.T) {
	cfg, err := hf.Load("qwen3-235b-a22b")
	if err != nil {
		t.Fatal(err)
	}
	const seq, want = 16384, 204808912896
	for _, mult := range []int{128, 4748} {
		got, err := MegatronPerStep(cfg, Shape{Batch: 1, Seq: seq}, mult)
		if err != nil {
			t.Fatal(err)
		}
		if got != want*seq {
			t.Errorf("vocab multiple %d: %d FLOPs per sequence, by hand %d·%d", mult, got, want, seq)
		}
	}
}
