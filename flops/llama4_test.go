package flops

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
)

// TestChunkedEntriesBruteForce: ChunkedEntries against an independent
// enumeration of the mask (query i sees key j iff j ≤ i and ⌊j/c⌋ = ⌊i/c⌋)
// score by score, and of the tiles holding at least one unmasked score.
func TestChunkedEntriesBruteForce(t *testing.T) {
	for _, s := range []int{1, 5, 16, 37} {
		for _, c := range []int{0, 1, 3, 4, 8, 40} {
			for _, tile := range []Tile{{1, 1}, {4, 4}, {3, 5}, {8, 2}} {
				var want int64
				for r0 := 0; r0 < s; r0 += tile.Rows {
					for c0 := 0; c0 < s; c0 += tile.Cols {
						r1, c1 := min(r0+tile.Rows, s), min(c0+tile.Cols, s)
						if anyVisible(r0, r1, c0, c1, c) {
							want += int64((r1 - r0) * (c1 - c0))
						}
					}
				}
				if got := ChunkedEntries(s, c, tile); got != want {
					t.Errorf("s %d chunk %d tile %v: %d, want %d", s, c, tile, got, want)
				}
			}
		}
	}
	// Closed form by hand: s = 10, c = 4: chunks of 4, 4, 2 → 10 + 10 + 3.
	if got := ChunkedEntries(10, 4, ExactTile); got != 23 {
		t.Errorf("s 10 chunk 4: %d, want 23", got)
	}
}

func anyVisible(r0, r1, c0, c1, chunk int) bool {
	for i := r0; i < r1; i++ {
		for j := c0; j < c1 && j <= i; j++ {
			if chunk <= 0 || i/chunk == j/chunk {
				return true
			}
		}
	}
	return false
}

// TestLlama4ConventionsByHand: Llama 4 Scout (D 5120, V 202048, L 48 with
// 36 RoPE layers chunked at 8192 and 12 NoPE layers full, H 40, G 8, d 128,
// E 16, K 1, F 8192, one shared expert of 8192) at one sequence of
// s = 16384, every convention written out by hand. q = 5120, kv = 1024.
//
// Megatron-LM d98e8a64 (megatron/training/training.py transformer_flops,
// GQA branch, SwiGLU, every layer MoE; V padded to 128: 202112) per token:
//
//	MLP    6·D·(3·F·K·48 + 3·S·48)     = 72,477,573,120
//	attn   48·6·(D·(q+2·kv) + q·D)      = 18,119,393,280
//	logits 6·D·V_pad                  =  6,208,880,640
//	core   s·48·6·q (causal /2 · 2)    = 24,159,191,040  ← chunks ignored, as Megatron counts
//	                                   = 120,965,038,080
//
// torchtitan v0.2.2 (73a0e69 models/llama4/model/args.py calls
// get_moe_model_nparams_and_flops with head_dims 2·(dim/n_heads) and the
// training seq_len on every layer: chunks ignored; torchtitan main b5bcd76
// has no Llama 4): N_mm = total 107,769,861,120 − embedding 1,034,485,760
// − routed 96,636,764,160 + routed/16 6,039,797,760 = 16,138,408,960;
// 6·N_mm 96,830,453,760 + 6·48·40·256·s 48,318,382,080 = 145,148,835,840;
// PaLM the same (no windows).
//
// model (per step): matmul weights per layer D·(q+2·kv) + q·D + E·D +
// 3·F·D + 3·S·D = 314,654,720, ×48 + V·D = 16,137,912,320, ×6·s =
// 1,586,421,332,705,280; attention 12·H·d·n per layer with n = 2·8192·8193/2
// = 67,117,056 on the chunked layers and s(s+1)/2 = 134,225,920 on the NoPE
// ones: 61,440·(36·67,117,056 + 12·134,225,920) = 247,414,275,440,640;
// total 1,833,835,608,145,920.
//
// hardware, --ac none, 128×128 tiles (chunk edges on tile edges): entries
// 2·128²·(1+…+64) = 68,157,440 chunked and 128²·(1+…+128) = 135,266,304
// full; attention 14·H·d·n = 71,680·(36·68,157,440 + 12·135,266,304) =
// 292,229,574,819,840; total 1,878,650,907,525,120.
func TestLlama4ConventionsByHand(t *testing.T) {
	c, err := hf.Load("llama-4-scout")
	if err != nil {
		t.Fatal(err)
	}
	s := Shape{Seq: 16384, Batch: 1}
	tot, err := Count(c, s, moe.AC{Mode: moe.ACNone}, Tile{Rows: 128, Cols: 128})
	if err != nil {
		t.Fatal(err)
	}
	for conv, want := range map[Convention]int64{
		Megatron:   16384 * 120_965_038_080,
		Torchtitan: 16384 * 145_148_835_840,
		PaLM:       16384 * 145_148_835_840,
		Model:      1_833_835_608_145_920,
		Hardware:   1_878_650_907_525_120,
	} {
		if got := tot.PerStep[conv]; got != want {
			t.Errorf("%s: %d, want %d", conv, got, want)
		}
	}
	// Maverick's Megatron count per token is the same sum: 24 dense layers
	// of 3·16384 and 24 MoE layers of 3·8192 routed + 3·8192 shared give
	// 6·D·2,359,296 as Scout's 48 MoE layers do.
	m, err := hf.Load("llama-4-maverick")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := MegatronPerStep(m, s, 128); err != nil || got != 16384*120_965_038_080 {
		t.Errorf("maverick megatron: %d, %v; want %d", got, err, int64(16384*120_965_038_080))
	}
}

// TestLlama4LayerOps: RoPE and the weightless L2 QK-norm only on the RoPE
// layers (Llama4TextAttention, modeling_llama4.py, transformers 000c33fd):
// Scout's layer 3 is NoPE (no rope, q_norm or k_norm record), layer 0 has
// them with no backward_weight for the norms.
func TestLlama4LayerOps(t *testing.T) {
	c, err := hf.Load("llama-4-scout")
	if err != nil {
		t.Fatal(err)
	}
	recs, err := Ops(c, Shape{Seq: 64, Batch: 1}, moe.AC{Mode: moe.ACNone}, ExactTile)
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		layer int
		op    moe.Op
		pass  moe.Pass
	}
	got := map[key]int64{}
	for _, r := range recs {
		got[key{r.Layer, r.Op, r.Pass}] += r.Count
	}
	for _, op := range []moe.Op{moe.OpRoPE, moe.OpQNorm, moe.OpKNorm} {
		if n := got[key{3, op, moe.Forward}]; n != 0 {
			t.Errorf("NoPE layer 3: %s forward %d, want none", op, n)
		}
	}
	// 64 tokens: rope over (40+8) heads × 128, q_norm 64·5120, k_norm 64·1024.
	for op, want := range map[moe.Op]int64{moe.OpRoPE: 64 * 48 * 128, moe.OpQNorm: 64 * 5120, moe.OpKNorm: 64 * 1024} {
		if n := got[key{0, op, moe.Forward}]; n != want {
			t.Errorf("layer 0: %s forward %d, want %d", op, n, want)
		}
	}
	if n := got[key{0, moe.OpQNorm, moe.BackwardWeight}]; n != 0 {
		t.Errorf("layer 0: q_norm backward_weight %d, want 0 (no weight)", n)
	}
}
