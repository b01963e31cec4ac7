package moetest

import (
	"math/rand/v2"
	"slices"

	"github.com/moescope/moescope/moe"
)

// mlaDrawers draw the multi-head-latent-attention model types; Config
// draws them with the others, MLAConfig only them.
var mlaDrawers = map[string]func(d *draw){
	"deepseek_v3": func(d *draw) { d.mla(); d.mlaV3Routing() },
	"kimi_k2":     func(d *draw) { d.mla(); d.mlaV3Routing() },
	"deepseek_v2": func(d *draw) { d.mla(); d.mlaV2Routing() },
}

// MLAModelTypes returns the model types MLAConfig draws, sorted.
func MLAModelTypes() []string {
	ts := make([]string, 0, len(mlaDrawers))
	for t := range mlaDrawers {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// MLAConfig draws a small config of a random MLA model type through
// hf.ParseConfig, as Config does for every type.
func MLAConfig(r *rand.Rand) *moe.Config {
	types := MLAModelTypes()
	return ConfigOf(r, types[r.IntN(len(types))])
}

// mla writes the latent attention keys of DeepseekV2Config and
// DeepseekV3Config: one key and value head per query head, an optional
// query latent (null: q_proj), small ranks and head dims, and the layer
// pattern (first_k_dense_replace, and DeepSeek's moe_layer_freq).
func (d *draw) mla() {
	d.set("num_key_value_heads", d.keys["num_attention_heads"])
	if d.r.IntN(2) == 0 {
		d.set("q_lora_rank", nil)
	} else {
		d.set("q_lora_rank", 2+d.r.IntN(4))
	}
	d.set("kv_lora_rank", 2+d.r.IntN(4))
	d.set("qk_nope_head_dim", 1+d.r.IntN(3))
	d.set("qk_rope_head_dim", pick(d.r, 2, 4))
	d.set("v_head_dim", 1+d.r.IntN(4))
	d.dense()
	d.set("first_k_dense_replace", d.r.IntN(d.layers))
	d.set("moe_layer_freq", pick(d.r, 1, 1, 2))
	if d.r.IntN(2) == 0 {
		d.set("num_nextn_predict_layers", d.r.IntN(2))
	}
	// YaRN as the DeepSeek checkpoints configure it (an original context
	// short enough that the correction range falls inside these few
	// rotated dims, or DeepSeek-V3's 4096), with the softmax-scale
	// correction off or on.
	if d.r.IntN(2) == 0 {
		d.set("rope_scaling", map[string]any{"type": "yarn", "factor": pick(d.r, 4, 40),
			"original_max_position_embeddings": pick(d.r, 16, 4096), "beta_fast": 32, "beta_slow": 1,
			"mscale": 1, "mscale_all_dim": pick(d.r, 0, 0.5, 1)})
	}
}

// mlaV3Routing writes DeepseekV3TopkRouter's keys: grouped sigmoid top-k
// with at least two experts per group, renormalization and scaling.
func (d *draw) mlaV3Routing() {
	e := d.experts("n_routed_experts", "moe_intermediate_size", pick(d.r, 2, 4, 4, 6))
	d.set("n_shared_experts", d.r.IntN(3))
	d.set("norm_topk_prob", d.r.IntN(2) == 0)
	d.set("routed_scaling_factor", pick(d.r, 1, 2.5))
	d.set("rope_interleave", d.r.IntN(2) == 0)
	d.set("scoring_func", "sigmoid")
	d.set("topk_method", "noaux_tc")
	var groups []int
	for g := 1; 2*g <= e; g++ {
		if e%g == 0 {
			groups = append(groups, g)
		}
	}
	g := groups[d.r.IntN(len(groups))]
	kg := 1 + d.r.IntN(g)
	d.set("n_group", g)
	d.set("topk_group", kg)
	d.set("num_experts_per_tok", 1+d.r.IntN(kg*e/g))
}

// mlaV2Routing writes DeepseekV2Moe's keys: greedy or group-limited
// softmax top-k, scaled.
func (d *draw) mlaV2Routing() {
	e := d.experts("n_routed_experts", "moe_intermediate_size", pick(d.r, 2, 3, 4, 6))
	d.set("n_shared_experts", d.r.IntN(3))
	d.set("routed_scaling_factor", pick(d.r, 1, 16))
	d.set("scoring_func", "softmax")
	if d.r.IntN(2) == 0 {
		d.set("topk_method", "greedy")
		return
	}
	d.set("topk_method", "group_limited_greedy")
	var groups []int
	for g := 1; g <= e; g++ {
		if e%g == 0 {
			groups = append(groups, g)
		}
	}
	g := groups[d.r.IntN(len(groups))]
	kg := 1 + d.r.IntN(g)
	d.set("n_group", g)
	d.set("topk_group", kg)
	d.set("num_experts_per_tok", 1+d.r.IntN(kg*e/g))
}
