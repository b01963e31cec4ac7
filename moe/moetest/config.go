// Package moetest is the one source of random model configs and the one
// Recorder that the tests of moe, flops and memory share, so that the
// checks of "accounting equals execution" all run on the same population
// of models.
//
// Config draws a config.json of a random supported model type and loads it
// with hf.ParseConfig, the loader of real checkpoints: every config drawn is
// one Hugging Face's config class of that type could load, normalized the
// way a real one is, and its options are only those the type has (a
// sigmoid router only where glm4_moe has one, a shared-expert gate only
// where qwen2_moe has one, and so on). Sizes are a few elements so that
// the reference implementation runs a draw in about a millisecond.
package moetest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
)

// drawers holds, per model type, what writes the keys of a random small
// config.json of that type beyond those every type shares (ConfigOf writes
// those). Each writes only keys its transformers configuration class has
// (DeepSeek-MoE: its remote configuration_deepseek.py).
var drawers = map[string]func(d *draw){
	"qwen3_moe": func(d *draw) { d.qwenMoE(); d.qwenWindows() },
	"qwen2_moe": func(d *draw) {
		d.qwenMoE()
		d.qwenWindows()
		// One gated shared expert of this width; 0 means none.
		w := 0
		if d.r.IntN(3) != 0 {
			w = 2 + d.r.IntN(4)
		}
		d.set("shared_expert_intermediate_size", w)
	},
	"mixtral": func(d *draw) {
		d.experts("num_local_experts", "intermediate_size", 2+d.r.IntN(5))
		d.auxLoss()
		if d.r.IntN(2) == 0 {
			d.set("sliding_window", 1+d.r.IntN(6)) // on every layer
		} else {
			d.set("sliding_window", nil)
		}
	},
	"olmoe": func(d *draw) {
		d.experts("num_experts", "intermediate_size", 2+d.r.IntN(5))
		d.set("norm_topk_prob", d.r.IntN(2) == 0)
		d.auxLoss()
	},
	"deepseek": func(d *draw) {
		d.dense()
		d.experts("n_routed_experts", "moe_intermediate_size", 2+d.r.IntN(5))
		if n := d.r.IntN(3); n > 0 { // DeepseekConfig's default is none
			d.set("n_shared_experts", n)
		}
		d.set("first_k_dense_replace", d.r.IntN(d.layers))
		d.set("moe_layer_freq", pick(d.r, 1, 1, 2))
		d.set("norm_topk_prob", d.r.IntN(2) == 0)
		d.set("aux_loss_alpha", pick(d.r, 0, 0.001))
		d.set("scoring_func", "softmax")
	},
	"glm4_moe": func(d *draw) {
		d.dense()
		// Mostly 4 or 6 experts, which can be grouped.
		e := d.experts("n_routed_experts", "moe_intermediate_size", pick(d.r, 2, 3, 4, 4, 6, 6))
		d.set("n_shared_experts", 1+d.r.IntN(2))
		d.set("first_k_dense_replace", d.r.IntN(d.layers)) // the last layer is MoE (not all dense)
		d.set("norm_topk_prob", d.r.IntN(2) == 0)
		d.set("routed_scaling_factor", pick(d.r, 1, 2.5))
		d.set("use_qk_norm", d.r.IntN(2) == 0)
		d.set("attention_bias", d.r.IntN(2) == 0)
		// Glm4MoeTopkRouter scores a group by its two best experts, so a
		// group holds at least two; top_k must fit in the kept groups.
		var groups []int
		for g := 1; 2*g <= e; g++ {
			if e%g == 0 {
				groups = append(groups, g)
			}
		}
		g := groups[d.r.IntN(len(groups))]
		kg := g
		if g > 1 && d.r.IntN(3) != 0 { // mostly some groups masked
			kg = 1 + d.r.IntN(g-1)
		}
		d.set("n_group", g)
		d.set("topk_group", kg)
		d.set("num_experts_per_tok", 1+d.r.IntN(kg*e/g))
		// A rotary fraction must rotate at least two of head_dim's dims.
		if d.headDim >= 4 {
			d.set("partial_rotary_factor", pick(d.r, 0.5, 1))
		} else {
			d.set("partial_rotary_factor", 1.0)
		}
	},
	"gpt_oss":     func(d *draw) { d.gptOSS() },
	"qwen3":       func(d *draw) { d.dense(); d.qwenWindows() },
	"llama":       func(d *draw) { d.dense() },
	"llama4_text": func(d *draw) { d.llama4() },
	"llama4":      func(d *draw) { d.llama4() }, // ConfigOf moves the keys into text_config
}

// headDimKey lists the model types whose config class has head_dim; the
// others (and their modeling code) take hidden_size / num_attention_heads.
var headDimKey = map[string]bool{"qwen3_moe": true, "mixtral": true, "glm4_moe": true, "qwen3": true, "llama": true, "gpt_oss": true,
	"llama4_text": true, "llama4": true}

// ModelTypes returns the model types Config draws, sorted; a test checks
// that they are hf.SupportedModelTypes.
func ModelTypes() []string {
	ts := make([]string, 0, len(drawers)+len(mlaDrawers))
	for t := range drawers {
		ts = append(ts, t)
	}
	ts = append(ts, MLAModelTypes()...)
	slices.Sort(ts)
	return ts
}

// draw is one config.json being drawn.
type draw struct {
	r       *rand.Rand
	keys    map[string]any
	layers  int
	headDim int
}

func (d *draw) set(key string, v any) { d.keys[key] = v }

// pick returns one of xs, uniformly.
func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

// dense writes the dense FFN width (intermediate_size).
func (d *draw) dense() { d.set("intermediate_size", 2+d.r.IntN(5)) }

// experts writes e routed experts of a random width under the type's key
// names, and a top-k, and returns e.
func (d *draw) experts(countKey, widthKey string, e int) int {
	d.set(countKey, e)
	d.set(widthKey, 2+d.r.IntN(4))
	d.set("num_experts_per_tok", 1+d.r.IntN(e))
	return e
}

// auxLoss writes HF's load-balancing loss keys.
func (d *draw) auxLoss() {
	d.set("router_aux_loss_coef", pick(d.r, 0.001, 0.01))
	d.set("output_router_logits", d.r.IntN(2) == 0)
}

// qwenMoE writes Qwen*MoeConfig's expert keys and layer pattern: dense
// layers from mlp_only_layers and decoder_sparse_step.
func (d *draw) qwenMoE() {
	d.dense()
	d.experts("num_experts", "moe_intermediate_size", 2+d.r.IntN(5))
	d.set("norm_topk_prob", d.r.IntN(2) == 0)
	d.set("decoder_sparse_step", pick(d.r, 1, 1, 2))
	only := []int{}
	for l := range d.layers {
		if d.r.IntN(4) == 0 {
			only = append(only, l)
		}
	}
	d.set("mlp_only_layers", only)
	d.auxLoss()
}

// qwenWindows writes the Qwen config classes' sliding-window keys: layers
// from max_window_layers on slide when use_sliding_window; an absent
// sliding_window is the class default, 4096, wider than any test sequence.
func (d *draw) qwenWindows() {
	d.set("use_sliding_window", d.r.IntN(3) != 0)
	d.set("max_window_layers", d.r.IntN(d.layers+1))
	switch d.r.IntN(4) {
	case 0:
		d.set("sliding_window", nil)
	case 1:
	default:
		d.set("sliding_window", 1+d.r.IntN(6))
	}
}

// gptOSS writes GptOssConfig's keys (configuration_gpt_oss.py,
// transformers 02b8f42b): experts, attention biases, a window on the
// layer_types' sliding layers (or the class's alternation), the clamped
// SwiGLU's limit (small ones so that the clamps bite on a test's
// activations) and YaRN (the class's default when absent). The aux loss
// keys are left at their defaults (output_router_logits false): moe/ref
// refuses GPT-OSS's aux loss (ref.CheckAux).
func (d *draw) gptOSS() {
	d.experts("num_local_experts", "intermediate_size", 2+d.r.IntN(5))
	d.set("attention_bias", d.r.IntN(4) != 0)
	d.set("sliding_window", 1+d.r.IntN(6))
	if d.r.IntN(2) == 0 {
		types := make([]string, d.layers)
		for l := range types {
			types[l] = pick(d.r, "sliding_attention", "full_attention")
		}
		d.set("layer_types", types)
	}
	d.set("swiglu_limit", pick(d.r, 0.02, 0.1, 7.0))
	d.set("swiglu_alpha", pick(d.r, 1.702, 3.0))
	if d.r.IntN(2) == 0 {
		d.set("rope_scaling", map[string]any{"rope_type": "yarn", "factor": pick(d.r, 2.0, 8.0),
			"original_max_position_embeddings": pick(d.r, 4, 16), "beta_fast": 32.0, "beta_slow": 1.0})
	}
}

// llama4 writes Llama4TextConfig's keys (configuration_llama4.py,
// transformers 008e5743): routed experts beside the shared expert of
// intermediate_size, dense layers of intermediate_size_mlp placed by
// interleave_moe_layer_step or moe_layers (the last layer always MoE), NoPE layers from no_rope_layers
// or no_rope_layer_interval, chunks of at most 6 (so that they cut a test's
// sequence), the L2 QK-norm, and temperature tuning with a floor_scale of
// at most 3 (so that the factor changes inside a test's sequence).
func (d *draw) llama4() {
	d.experts("num_local_experts", "intermediate_size", 2+d.r.IntN(5))
	d.set("intermediate_size_mlp", 2+d.r.IntN(5))
	if d.r.IntN(2) == 0 {
		d.set("interleave_moe_layer_step", 1+d.r.IntN(min(d.layers, 2))) // step ≤ layers: some layer is MoE
	} else {
		layers := []int{}
		for l := range d.layers - 1 {
			if d.r.IntN(2) == 0 {
				layers = append(layers, l)
			}
		}
		d.set("moe_layers", append(layers, d.layers-1)) // one MoE layer at least: the loader stacks experts
	}
	if d.r.IntN(3) == 0 {
		d.set("no_rope_layer_interval", pick(d.r, 1, 2, 4))
	} else {
		rope := make([]int, d.layers)
		for l := range rope {
			rope[l] = d.r.IntN(2)
		}
		d.set("no_rope_layers", rope)
	}
	d.set("attention_chunk_size", 1+d.r.IntN(6))
	d.set("use_qk_norm", d.r.IntN(3) != 0)
	d.set("attn_temperature_tuning", d.r.IntN(3) != 0)
	d.set("floor_scale", pick(d.r, 1, 2, 3))
	d.set("attn_scale", pick(d.r, 0.1, 0.5))
	d.set("attention_bias", d.r.IntN(4) == 0)
}

// Config draws a small config of a random model type (ModelTypes) through
// hf.ParseConfig; the same r state gives the same config. It panics when the
// loader refuses a draw: that is a bug of the generator, and the message
// holds the config.json.
func Config(r *rand.Rand) *moe.Config {
	types := ModelTypes()
	return ConfigOf(r, types[r.IntN(len(types))])
}

// ConfigOf is Config for a given model type.
func ConfigOf(r *rand.Rand, modelType string) *moe.Config {
	drawer, ok := drawers[modelType]
	if !ok {
		drawer, ok = mlaDrawers[modelType]
	}
	if !ok {
		panic(fmt.Sprintf("moetest: no drawer for model_type %q", modelType))
	}
	d := &draw{r: r, keys: map[string]any{"model_type": modelType}, layers: 1 + r.IntN(3), headDim: 2 * (1 + r.IntN(3))}
	kv := 1 + r.IntN(2)
	heads := kv * (1 + r.IntN(2))
	d.set("vocab_size", 5+r.IntN(12))
	d.set("num_hidden_layers", d.layers)
	d.set("num_attention_heads", heads)
	d.set("num_key_value_heads", kv)
	if headDimKey[modelType] {
		d.set("hidden_size", 4+r.IntN(6))
		d.set("head_dim", d.headDim)
	} else {
		d.set("hidden_size", heads*d.headDim)
	}
	d.set("hidden_act", "silu")
	d.set("rms_norm_eps", pick(r, 1e-6, 1e-5))
	d.set("rope_theta", pick(r, 1e4, 1e6))
	d.set("initializer_range", pick(r, 0.1, 0.3, 0.5))
	d.set("tie_word_embeddings", r.IntN(2) == 0)
	drawer(d)
	if modelType == "llama4" { // Llama4Config keeps the text model's keys in text_config
		delete(d.keys, "model_type")
		d.keys = map[string]any{"model_type": modelType, "text_config": d.keys}
	}
	data, err := json.Marshal(d.keys)
	if err != nil {
		panic(err)
	}
	c, err := hf.ParseConfig(data, "moetest "+modelType)
	if err != nil {
		panic(fmt.Sprintf("moetest: the loader refuses a drawn config %s: %v", data, err))
	}
	return c
}

// Tokens draws batch sequences of seq+1 token ids (inputs and the shifted
// labels) below c.Vocab.
func Tokens(r *rand.Rand, c *moe.Config, batch, seq int) [][]int {
	ts := make([][]int, batch)
	for i := range ts {
		ts[i] = make([]int, seq+1)
		for j := range ts[i] {
			ts[i][j] = r.IntN(c.Vocab)
		}
	}
	return ts
}

// Policies returns every checkpointing policy the tests run: none,
// selective, full, layer:N for N = 1, 2, 3, which in the drawn models
// of one to three layers checkpoint every block, every second and the
// third, and Megatron's recompute modules: layernorm, moe_act and moe
// alone, layernorm with moe_act, and all three; and memory_budget at 0
// (full), 0.4, 0.8 (the knapsack's choices) and 1 (none).
func Policies() []moe.AC {
	return []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull},
		{Mode: moe.ACLayer, Every: 1}, {Mode: moe.ACLayer, Every: 2}, {Mode: moe.ACLayer, Every: 3},
		{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm}, {Mode: moe.ACModules, Modules: moe.RecomputeMoEAct},
		{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoEAct},
		{Mode: moe.ACModules, Modules: moe.RecomputeMoE}, {Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoEAct | moe.RecomputeMoE},
		{Mode: moe.ACMemoryBudget, Budget: 0}, {Mode: moe.ACMemoryBudget, Budget: 0.4},
		{Mode: moe.ACMemoryBudget, Budget: 0.8}, {Mode: moe.ACMemoryBudget, Budget: 1}}
}
