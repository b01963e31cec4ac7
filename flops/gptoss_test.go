package flops

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
)

// TestGPTOSSConventionsByHand: GPT-OSS-120B (D 2880, V 201088, L 36, H 64,
// G 8, d 64, E 128, K 4, F 2880; even layers a 128-token window, odd layers
// full) at one sequence of s = 4096, every convention written out by hand.
// q = H·d = 4096, kv = G·d = 512.
//
// Megatron-LM d98e8a64 (megatron/training/training.py transformer_flops,
// GQA branch, SwiGLU, V = 201088 = 1571·128 needs no padding) per token:
//
//	MLP    6·D·3·F·K·L                 = 21,499,084,800
//	attn   L·6·(D·(q+2·kv) + q·D)       =  5,733,089,280
//	logits 6·D·V                       =  3,474,800,640
//	core   s·L·6·q (causal /2 · 2)      =  3,623,878,656   ← every layer at s: windows ignored
//	                                     = 34,330,853,376
//
// torchtitan (6·N_mm + 6·H·2d·min(s, w) per layer): N_mm = total
// 116,829,156,672 − embedding 579,133,440 − routed 114,701,598,720 +
// routed·4/128 3,584,424,960 = 5,132,849,472 (biases and sinks inside, as
// torchtitan's named_parameters count them); 6·N_mm = 30,797,096,832;
// attention 18·6·64·128·4096 + 18·6·64·128·128 = 3,737,124,864; total
// 34,534,221,696. PaLM: 6·N_mm + 12·L·H·d·s = 38,044,854,144.
//
// model (per step): matmul weights per layer D·(q+2·kv) + q·D + E·D +
// K·3·F·D = 126,443,520, ×36 + V·D = 5,131,100,160, ×6·s =
// 126,101,917,532,160; attention 12·H·d·n per layer (forward 2·n·2d,
// backward 2·2n·2d per head) with n = s(s+1)/2 = 8,390,656 full and
// 128·129/2 + (s−128)·128 = 516,160 windowed: 18·49,152·(8,390,656 +
// 516,160) = 7,880,180,760,576; total 133,982,098,292,736. Sinks add no
// multiply-add (moe/sinks.go); biases belong to their linears (moe/ops.go).
//
// hardware, --ac none, 128×128 tiles: attention entries become 128²·(1+…+32)
// = 8,650,752 per full layer and 128² + 31·128·256 = 1,032,192 per windowed
// layer (each 128-row block past the first touches two 128-column tiles),
// and flash backward recomputes QKᵀ (2·n·d per head): attention
// 18·64·(4·n·d + 8·n·d + 2·n·d) over both n = 1,032,192·(8,650,752 +
// 1,032,192) = 9,994,657,333,248; with the matmuls above, total
// 136,096,574,865,408.
func TestGPTOSSConventionsByHand(t *testing.T) {
	c, err := hf.Load("gpt-oss-120b")
	if err != nil {
		t.Fatal(err)
	}
	s := Shape{Seq: 4096, Batch: 1}
	tot, err := Count(c, s, moe.AC{Mode: moe.ACNone}, Tile{Rows: 128, Cols: 128})
	if err != nil {
		t.Fatal(err)
	}
	for conv, want := range map[Convention]int64{
		Megatron:   4096 * 34_330_853_376,
		Torchtitan: 4096 * 34_534_221_696,
		PaLM:       4096 * 38_044_854_144,
		Model:      133_982_098_292_736,
		Hardware:   136_096_574_865_408,
	} {
		if tot.PerStep[conv] != want {
			t.Errorf("%s: %d FLOPs per step, hand count %d", conv, tot.PerStep[conv], want)
		}
	}
}

// TestGPTOSSMegatronIgnoresWindows: Megatron-LM's formula has no window
// term, so removing GPT-OSS's windows leaves it unchanged, while torchtitan
// (min(s, w)) and the model count (exact mask) rise.
func TestGPTOSSMegatronIgnoresWindows(t *testing.T) {
	c, err := hf.Load("gpt-oss-20b")
	if err != nil {
		t.Fatal(err)
	}
	full := *c
	full.Window = make([]int, c.Layers)
	s := Shape{Seq: 2048, Batch: 2}
	for _, f := range []struct {
		conv Convention
		same bool
		fn   func(*moe.Config) (int64, error)
	}{
		{Megatron, true, func(m *moe.Config) (int64, error) { return MegatronPerStep(m, s, 128) }},
		{Torchtitan, false, func(m *moe.Config) (int64, error) { return TorchtitanPerStep(m, s) }},
		{Model, false, func(m *moe.Config) (int64, error) { return ModelPerStep(m, s) }},
	} {
		a, err1 := f.fn(c)
		b, err2 := f.fn(&full)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if (a == b) != f.same || a > b {
			t.Errorf("%s: windowed %d, full %d; want equal = %v", f.conv, a, b, f.same)
		}
	}
}
