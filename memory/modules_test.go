package memory

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/moetest"
)

// TestSavedModulesByHand works the saved bytes of one TinyMoE block (D 8,
// H 2, G 1, d 4, E 4, K 2, F 6, head QK-norm, renormalized top-k; bf16
// activations, fp32 rstd/lse/router state, int64 indices) per token by hand.
// Under none: attn_norm input 16 + rstd 4, q_proj input 16, q/k norms
// 16 + 8 + 8 + 4, attention q 16, k 8, v 8, output 16, lse 8, ffn_norm
// input 16 + rstd 4, router input 16, scores 16, indices 16, values 8,
// denominator 4, dispatch order 16, expert_gate input 32, gate, silu_gate,
// up 24 each, expert_down input 24, combine expert_output 32, weights 8:
// 392 B. Megatron's layernorm module (transformer_layer.py, CheckpointWithoutOutput
// on pre_mlp_layernorm, a separate module in MoE layers under the TE spec)
// frees the router input 16 and saves no rstd 4: 372 B. moe_act (experts.py
// TEGroupedMLP) keeps fc1's output (gate, up) and frees silu_gate 24 and
// the down input 24: 344 B. Both: 324 B. moe (moe_layer.py, the whole
// MoELayer.forward under tensor_parallel.checkpoint, which saves only its
// input) keeps the router input but frees everything after it: scores 16,
// indices 16, values 8, denominator 4, order 16, expert_gate input 32,
// gate, silu_gate, up 24 each, down input 24, expert_output 32, weights 8,
// 228 B: 164 B; with moe_act nothing more (164 B), with layernorm also the
// norm's rstd and output, the layer's saved input (144 B).
func TestSavedModulesByHand(t *testing.T) {
	c := moetest.TinyMoE()
	const tokens = 4 // batch 1 × seq 4
	for _, tc := range []struct {
		ac       string
		perToken int64
	}{
		{"none", 392}, {"modules:layernorm", 372}, {"modules:moe_act", 344}, {"modules:layernorm,moe_act", 324},
		{"modules:moe_act,layernorm", 324},
		{"modules:moe", 164}, {"modules:moe,moe_act", 164}, {"modules:layernorm,moe", 144},
		{"modules:layernorm,moe_act,moe", 144},
	} {
		ac, err := moe.ParseAC(tc.ac)
		if err != nil {
			t.Fatal(err)
		}
		for layer := 0; layer < c.Layers; layer++ {
			rs, err := Saved(c, layer, Shape{Batch: 1, Seq: tokens, AC: ac, Act: moe.BF16})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := SavedBytes(rs), tc.perToken*tokens; got != want {
				t.Errorf("%s layer %d: %d B, by hand %d B", tc.ac, layer, got, want)
			}
		}
	}
}

// TestSavedModulesMLA: in DeepSeek-V3 the layernorm module frees, per
// token, attn_norm's rstd (4 B) and its output, the q_a_proj input (2·D B),
// in every block (MLA's input norm is a separate module in Megatron's TE
// spec), and in the MoE block 5 also ffn_norm's rstd and the router input
// (4 + 2·D B); the dense block 0's pre-MLP norm is fused into fc1 and keeps
// everything. moe_act frees 2·2·K·F B of the MoE block's routed experts.
// moe frees the MoE layer but its input (listed below).
func TestSavedModulesMLA(t *testing.T) {
	c, err := hf.Load("deepseek-v3")
	if err != nil {
		t.Fatal(err)
	}
	const T = 8
	D, K, F := int64(c.Hidden), int64(c.TopK), int64(c.ExpertFFN)
	E, S := int64(c.Experts), int64(c.SharedExperts*c.SharedFFN)
	if !c.NormTopK || c.SharedGated || !c.MoELayer[5] || c.MoELayer[0] {
		t.Fatal("deepseek-v3: want renormalized top-k, ungated shared experts, block 0 dense, block 5 MoE")
	}
	moeInside := 4*E + 8*K + 4*K + 4 + 8*K + 2*K*D + 8*K*F + 2*K*D + 4*K + 8*S
	for _, tc := range []struct {
		layer      int
		ac         string
		freedToken int64
	}{
		{0, "modules:layernorm", 4 + 2*D},
		{5, "modules:layernorm", 2 * (4 + 2*D)},
		{0, "modules:moe_act", 0},
		{5, "modules:moe_act", 4 * K * F},
		{5, "modules:layernorm,moe_act", 2*(4+2*D) + 4*K*F},
		// moe frees the MoE layer's inside: scores 4·E, indices 8·K,
		// renormalized values 4·K and denominator 4, order 8·K, the
		// experts' input 2·K·D, gate, silu_gate, up and down input
		// 4·2·K·F, the expert outputs 2·K·D and weights 4·K, and the
		// shared expert's four tensors 4·2·S; nothing of the dense block.
		{0, "modules:moe", 0},
		{5, "modules:moe", moeInside},
		{5, "modules:moe,moe_act", moeInside},
		{5, "modules:layernorm,moe", 2*(4+2*D) + moeInside},
	} {
		ac, err := moe.ParseAC(tc.ac)
		if err != nil {
			t.Fatal(err)
		}
		none, err := Saved(c, tc.layer, Shape{Batch: 1, Seq: T, AC: moe.AC{Mode: moe.ACNone}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := Saved(c, tc.layer, Shape{Batch: 1, Seq: T, AC: ac})
		if err != nil {
			t.Fatal(err)
		}
		if d := SavedBytes(none) - SavedBytes(got); d != tc.freedToken*T {
			t.Errorf("layer %d %s: frees %d B, by hand %d B", tc.layer, tc.ac, d, tc.freedToken*T)
		}
	}
}
