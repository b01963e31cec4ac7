package memory

import (
	"testing"

	"github.com/moescope/moescope/moe"
)

// perLayerBytes is the saved-activation size of one block derived by hand
// in Korthikanti et al.'s manner (2022, §4.1: sum, per token, the bytes of
// every tensor autograd keeps), for our block: RMSNorm (input + fp32 rstd),
// GQA projections, flash attention (q, k, v, output in bf16 and fp32
// log-sum-exp per head) or eager attention (probabilities b·H·s² bf16),
// SwiGLU FFN or a top-K MoE with fp32 router state, no dropout, bf16
// activations. Korthikanti's GPT block (s·b·h·(34 + 5·a·s/h)) differs by its
// GeLU MLP of 4h, dropout masks and LayerNorm; the derivation is the same.
func perLayerBytes(c *moe.Config, b, s int64, ac moe.AC, attn Attention, ep int, layer int) int64 {
	T := b * s
	D, H, G := int64(c.Hidden), int64(c.Heads), int64(c.KVHeads)
	q, kv := H*int64(c.HeadDim), G*int64(c.HeadDim)
	if ac.FullyCheckpointed(layer) {
		return 2 * T * D // the block input only
	}
	moeLayer := c.MoELayer[layer]
	K, E, F, Fd := int64(c.TopK), int64(c.Experts), int64(c.ExpertFFN), int64(c.DenseFFN)
	if ac.Mode == moe.ACSelective {
		// input 2D; every other mm output: q (2q), v (2kv), then
		// gate (2Fd) and down (2D) in dense blocks; flash attention's
		// output 2q and lse 4H (eager attention's bmm and softmax are
		// not in the save list: nothing); MoE: top-k values 4K and
		// indices 8K, and with ep > 1 both all-to-all outputs 2·2KD.
		n := T * (2*D + 2*q + 2*kv)
		if attn == Flash {
			n += T * (2*q + 4*H)
		}
		if !moeLayer {
			return n + T*(2*Fd+2*D)
		}
		n += T * 12 * K
		if ep > 1 {
			n += T * 4 * K * D
		}
		return n
	}
	// none: attn_norm 2D + 4, qkv input 2D, q 2q, k 2kv, v 2kv,
	// attention output 2q + lse 4H, ffn_norm 2D + 4.
	n := T * (2*D + 4 + 2*D + 2*q + 2*kv + 2*kv + 2*q + 4*H + 2*D + 4)
	if attn == Eager {
		n += 2*b*H*s*s - 4*T*H
	}
	if c.QKNorm == moe.QKNormHead {
		n += T * (2*q + 4*H + 2*kv + 4*G)
	}
	if !moeLayer {
		return n + T*(2*D+8*Fd) // FFN input, gate, up, silu, down input
	}
	// router input 2D, scores 4E, indices 8K, dispatch order 8K,
	// dispatched rows 2KD, gate, silu(gate), up, product 8KF, expert
	// outputs 2KD, weights 4K (the renormalized top-k weights are the
	// combine weights: kept once).
	n += T * (2*D + 4*E + 8*K + 8*K + 2*K*D + 8*K*F + 2*K*D + 4*K)
	if c.NormTopK {
		// The renormalizing division keeps both operands: the selected
		// values 4K and their sum 4 (torch 1.13 saved-tensor hooks on div).
		n += T * (4*K + 4)
	}
	return n
}

func TestSavedMatchesHandFormula(t *testing.T) {
	policies := []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}, {Mode: moe.ACLayer, Every: 2}}
	for _, c := range []*moe.Config{denseCfg(), moeCfg()} {
		for _, ac := range policies {
			for _, attn := range []Attention{Flash, Eager} {
				for _, ep := range []int{1, 2} {
					for layer := 0; layer < c.Layers; layer++ {
						sh := Shape{Batch: 2, Seq: 16, AC: ac, Attention: attn, EP: ep, Act: moe.BF16}
						rs, err := Saved(c, layer, sh)
						if err != nil {
							t.Fatal(err)
						}
						got, want := SavedBytes(rs), perLayerBytes(c, 2, 16, ac, attn, ep, layer)
						if got != want {
							t.Errorf("%s %s %s ep %d layer %d: %d B, hand formula %d B", c.Name, ac, attn, ep, layer, got, want)
						}
					}
				}
			}
		}
	}
}

func TestSavedHeadAndEmbedding(t *testing.T) {
	c := denseCfg()
	sh := Shape{Batch: 3, Seq: 5, AC: moe.AC{Mode: moe.ACFull}}
	T := int64(15)
	head, err := Saved(c, c.LayerHead(), sh)
	if err != nil {
		t.Fatal(err)
	}
	// final_norm input 2D + rstd 4, lm_head input 2D, log-probabilities
	// 4V (fp32), targets 8 (int64), per token.
	if got, want := SavedBytes(head), T*(2*32+4+2*32+4*64+8); got != want {
		t.Errorf("head: %d B, want %d", got, want)
	}
	emb, _ := Saved(c, moe.LayerEmbed, sh)
	if got := SavedBytes(emb); got != 8*T {
		t.Errorf("embedding: %d B, want %d", got, 8*T)
	}
	for _, bad := range []Shape{{Batch: 0, Seq: 5}, {Batch: 1, Seq: 0}, {Batch: 1, Seq: 1, Attention: "sparse"}} {
		if _, err := Saved(c, 0, bad); err == nil {
			t.Errorf("shape %+v accepted", bad)
		}
	}
	if _, err := Saved(c, 7, sh); err == nil {
		t.Error("layer 7 of 2 accepted")
	}
}
