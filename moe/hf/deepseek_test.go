package hf

import (
	"math"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
)

// mlaLayer is the hand count of one MLA attention block's tensors as the
// checkpoints name and shape them (DeepseekV3Attention): q_proj [H·192, D]
// or q_a_proj [Rq, D] + q_a_layernorm [Rq] + q_b_proj [H·192, Rq];
// kv_a_proj_with_mqa [512+64, D]; kv_a_layernorm [512]; kv_b_proj
// [H·(128+128), 512]; o_proj [D, H·128]; plus the two block norms [D].
// Every built-in of the family has nope = v = 128, rope = 64, Rkv = 512.
func mlaLayer(D, H, qRank int64) int64 {
	q := D * H * 192
	if qRank > 0 {
		q = qRank*D + qRank + H*192*qRank
	}
	return 2*D + q + (512+64)*D + 512 + H*256*512 + D*H*128
}

// TestMLABuiltinParams pins the parameter counts of the DeepSeek-V3
// family's built-ins against per-tensor closed forms written out from each
// checkpoint's config.json, and against the figure its publisher gives.
// e_score_correction_bias (E per MoE layer) is a buffer in transformers'
// DeepseekV3TopkRouter and is not counted; neither are the MTP modules.
func TestMLABuiltinParams(t *testing.T) {
	for _, tc := range []struct {
		name                string
		total, active       int64
		pubTotal, pubActive float64 // billions
		tolTotal, tolActive float64
		activeLessEmbed     bool // the publisher's active count leaves the input embedding out
		pub                 string
	}{
		{"deepseek-v3",
			2*129280*7168 + 7168 + 61*mlaLayer(7168, 128, 1536) + 3*3*18432*7168 + 58*(256*7168+256*3*2048*7168+3*2048*7168),
			2*129280*7168 + 7168 + 61*mlaLayer(7168, 128, 1536) + 3*3*18432*7168 + 58*(256*7168+8*3*2048*7168+3*2048*7168),
			671, 37, 0.5, 0.6, false, "DeepSeek-V3 model card: 671B total, 37B activated (README_WEIGHTS.md: 36.7B)"},
		{"kimi-k2",
			2*163840*7168 + 7168 + 61*mlaLayer(7168, 64, 1536) + 1*3*18432*7168 + 60*(384*7168+384*3*2048*7168+3*2048*7168),
			2*163840*7168 + 7168 + 61*mlaLayer(7168, 64, 1536) + 1*3*18432*7168 + 60*(384*7168+8*3*2048*7168+3*2048*7168),
			1000, 32, 30, 1, false, "Kimi-K2 model card: 1T total (1.04T in Moonshot's tech report), 32B activated"},
		{"deepseek-v2-lite",
			2*102400*2048 + 2048 + 27*mlaLayer(2048, 16, 0) + 1*3*10944*2048 + 26*(64*2048+64*3*1408*2048+3*2816*2048),
			2*102400*2048 + 2048 + 27*mlaLayer(2048, 16, 0) + 1*3*10944*2048 + 26*(64*2048+6*3*1408*2048+3*2816*2048),
			15.7, 2.4, 0.05, 0.06, true, "DeepSeek-V2-Lite model card: 15.7B total, 2.4B activated (2.45B here without the input embedding; the card does not say what it leaves out)"},
		{"moonlight-16b-a3b",
			2*163840*2048 + 2048 + 27*mlaLayer(2048, 16, 0) + 1*3*11264*2048 + 26*(64*2048+64*3*1408*2048+3*2816*2048),
			2*163840*2048 + 2048 + 27*mlaLayer(2048, 16, 0) + 1*3*11264*2048 + 26*(64*2048+6*3*1408*2048+3*2816*2048),
			16, 3, 0.5, 0.5, false, "Moonlight-16B-A3B's name and model card: 16B total, 3B activated"},
	} {
		c, err := Load(tc.name)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		total, active := countParams(c)
		if total != tc.total || active != tc.active {
			t.Errorf("%s: params %d / %d, hand per-tensor count %d / %d", tc.name, total, active, tc.total, tc.active)
		}
		pubActive := float64(active)
		if tc.activeLessEmbed {
			pubActive -= float64(c.Vocab) * float64(c.Hidden)
		}
		if d := math.Abs(float64(total)/1e9 - tc.pubTotal); d > tc.tolTotal {
			t.Errorf("%s: total %.3fB vs published %vB (%s)", tc.name, float64(total)/1e9, tc.pubTotal, tc.pub)
		}
		if d := math.Abs(pubActive/1e9 - tc.pubActive); d > tc.tolActive {
			t.Errorf("%s: active %.3fB vs published %vB (%s)", tc.name, pubActive/1e9, tc.pubActive, tc.pub)
		}
		// The selection bias is listed (it is in the checkpoint) as a buffer.
		var bias int64
		for _, p := range c.Params() {
			if p.Buffer {
				bias += p.Elements()
			}
		}
		if want := int64(0); c.SelectionBias {
			if want = int64(c.Experts * c.MoELayers()); bias != want {
				t.Errorf("%s: %d buffer elements, want E·L_moe = %d", tc.name, bias, want)
			}
		} else if bias != want {
			t.Errorf("%s: %d buffer elements, want none (softmax router)", tc.name, bias)
		}
	}
}

// TestMLABuiltinStructure checks each built-in's normalization against its
// config.json and the modeling code's rules (see deepseek.go).
func TestMLABuiltinStructure(t *testing.T) {
	v3, err := Load("deepseek-v3")
	if err != nil {
		t.Fatal(err)
	}
	// YaRN factor 40, mscale_all_dim 1: m = 0.1·ln 40 + 1, scale m²/√192.
	m := 0.1*math.Log(40) + 1
	if v3.MoELayers() != 58 || v3.MoELayer[2] || !v3.MoELayer[3] || v3.Score != moe.Sigmoid || !v3.SelectionBias ||
		v3.Groups != 8 || v3.TopKGroups != 4 || v3.RoutedScale != 2.5 || !v3.NormTopK || v3.NormTopKEps != 1e-20 ||
		v3.MLA != (moe.MLA{QRank: 1536, KVRank: 512, Nope: 128, Rope: 64, V: 128, NormEps: 1e-6}) ||
		v3.HeadDim != 192 || v3.VHeadDim() != 128 || v3.RotaryDim() != 64 || !v3.RopeInterleave ||
		math.Abs(v3.AttnScale-m*m/math.Sqrt(192)) > 1e-15 || v3.MTPLayers != 1 || v3.AuxLossCoef != 0 || v3.RopeScaling != "yarn" {
		t.Errorf("deepseek-v3 normalized wrongly: %+v", v3)
	}
	lite, _ := Load("deepseek-v2-lite")
	if lite.Score != moe.Softmax || lite.SelectionBias || lite.NormTopK || lite.Groups != 1 || lite.RoutedScale != 1 ||
		lite.MLA.QRank != 0 || lite.AttnScale != 0 || lite.MoELayers() != 26 || lite.SharedFFN != 1408 || lite.SharedExperts != 2 {
		t.Errorf("deepseek-v2-lite normalized wrongly: %+v", lite)
	}
	moon, _ := Load("moonlight-16b-a3b")
	if moon.MLA.QRank != 0 || moon.RoutedScale != 2.446 || moon.NormEps != 1e-5 || moon.AttnScale != 0 || moon.RopeScaling != "" {
		t.Errorf("moonlight normalized wrongly: %+v", moon)
	}
	k2, _ := Load("kimi-k2")
	if k2.Experts != 384 || k2.Heads != 64 || k2.Groups != 1 || k2.MoELayers() != 60 || k2.ModelType != "kimi_k2" {
		t.Errorf("kimi-k2 normalized wrongly: %+v", k2)
	}
}

// mlaJSON is a small deepseek_v3 config.json with extra keys spliced in.
func mlaJSON(extra string) string {
	return `{"model_type": "deepseek_v3", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 8,
	"moe_intermediate_size": 4, "num_hidden_layers": 3, "num_attention_heads": 2, "n_routed_experts": 4,
	"num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "kv_lora_rank": 6, "qk_nope_head_dim": 4,
	"qk_rope_head_dim": 2, "v_head_dim": 3, "first_k_dense_replace": 1` + extra + `}`
}

// TestParseMLAConfig checks transformers' defaults for absent keys and the
// refusal, by name and value, of what the modeling code does not do.
func TestParseMLAConfig(t *testing.T) {
	c, err := ParseConfig([]byte(mlaJSON("")), "absent")
	if err != nil {
		t.Fatal(err)
	}
	// DeepseekV3Config: q_lora_rank 1536, n_shared_experts 1,
	// routed_scaling_factor 2.5, norm_topk_prob true, rope_interleave true.
	if c.MLA.QRank != 1536 || c.SharedExperts != 1 || c.RoutedScale != 2.5 || !c.NormTopK || !c.RopeInterleave ||
		c.KVHeads != 2 || c.HeadDim != 6 || c.MTPLayers != 0 || c.AttnScale != 0 {
		t.Errorf("defaults: %+v", c)
	}
	if c, err := ParseConfig([]byte(mlaJSON(`, "q_lora_rank": null, "rope_interleave": false, "moe_layer_freq": 2`)), "null"); err != nil {
		t.Fatal(err)
	} else if c.MLA.QRank != 0 || c.RopeInterleave || c.MoELayer[1] || !c.MoELayer[2] {
		t.Errorf("q_lora_rank null, moe_layer_freq 2: %+v", c)
	}
	v2 := strings.Replace(mlaJSON(`, "topk_method": "group_limited_greedy", "norm_topk_prob": true, "routed_scaling_factor": 16`), "deepseek_v3", "deepseek_v2", 1)
	if c, err := ParseConfig([]byte(v2), "v2"); err != nil {
		t.Fatal(err)
	} else if c.Score != moe.Softmax || c.NormTopK || c.Groups != 2 || c.TopKGroups != 1 || c.RoutedScale != 16 || c.SharedExperts != 2 {
		t.Errorf("deepseek_v2 group_limited_greedy: %+v", c)
	}
	for _, tc := range []struct{ extra, want string }{
		{`, "scoring_func": "softmax"`, `scoring_func = softmax: not supported (deepseek_v3's router implements only "sigmoid")`},
		{`, "topk_method": "greedy"`, `topk_method = greedy: not supported`},
		{`, "q_lora_rank": 0`, `q_lora_rank = 0: not supported`},
		{`, "attention_bias": true`, `attention_bias = true: not supported`},
		{`, "num_key_value_heads": 1`, `kv_heads = 1: must equal heads = 2 under MLA`},
		{`, "qk_rope_head_dim": 3`, `mla.qk_rope_head_dim = 3: must be even`},
		{`, "kv_lora_rank": 0`, `kv_lora_rank = 0: not supported (must be ≥ 1)`},
	} {
		_, err := ParseConfig([]byte(mlaJSON(tc.extra)), "bad")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.extra, err, tc.want)
		}
	}
}
