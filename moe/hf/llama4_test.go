package hf

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
)

// smallLlama4 is a flat llama4_text config.json with the required keys
// only: the rest take Llama4TextConfig's defaults (configuration_llama4.py,
// transformers 008e5743).
const smallLlama4 = `{"model_type": "llama4_text", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 8,
  "num_attention_heads": 4, "intermediate_size": 16, "num_local_experts": 4, "num_experts_per_tok": 1`

// TestLlama4Defaults: absent keys take Llama4TextConfig's defaults and land
// in Config fields as modeling_llama4.py (transformers 000c33fd) runs them:
// every layer MoE (interleave_moe_layer_step 1), NoPE on every fourth layer
// ((i+1) % 4 == 0), chunks of 8192 on the RoPE layers, L2 QK-norm,
// temperature tuning 8192 / 0.1, head_dim 128, 8 KV heads, rope_theta
// 500000, a sigmoid router scaling the input, one shared expert of
// intermediate_size, no aux loss (Llama4ForCausalLM adds none).
func TestLlama4Defaults(t *testing.T) {
	c, err := ParseConfig([]byte(smallLlama4+`, "num_key_value_heads": 2}`), "small")
	if err != nil {
		t.Fatal(err)
	}
	nope := []bool{false, false, false, true, false, false, false, true}
	chunk := []int{8192, 8192, 8192, 0, 8192, 8192, 8192, 0}
	if !reflect.DeepEqual(c.NoRope, nope) || !reflect.DeepEqual(c.Chunk, chunk) || c.MoELayers() != 8 {
		t.Errorf("no_rope %v chunk %v, %d MoE layers; want %v %v 8", c.NoRope, c.Chunk, c.MoELayers(), nope, chunk)
	}
	if c.QKNorm != moe.QKNormL2Rope || c.Temperature == nil || *c.Temperature != (moe.AttnTemperature{FloorScale: 8192, Scale: 0.1}) {
		t.Errorf("qk_norm %s temperature %v", c.QKNorm, c.Temperature)
	}
	if c.HeadDim != 128 || c.KVHeads != 2 || c.RopeTheta != 500000 || !c.RopeInterleave || c.QKVBias || c.OProjBias {
		t.Errorf("attention: %+v", c)
	}
	if c.Score != moe.Sigmoid || !c.RouteInput || c.NormTopK || c.SharedExperts != 1 || c.SharedFFN != 16 ||
		!c.FusedExperts || !c.FusedHalves || c.AuxLossCoef != 0 || c.OutputRouterLogits || c.DenseFFN != 0 {
		t.Errorf("routing: %+v", c)
	}
	// Absent num_key_value_heads is 8, the class default, not the head count.
	c, err = ParseConfig([]byte(strings.Replace(smallLlama4, `"num_attention_heads": 4`, `"num_attention_heads": 8`, 1)+`}`), "small")
	if err != nil || c.KVHeads != 8 {
		t.Errorf("kv heads %v, %v; want 8", c, err)
	}
}

// TestLlama4Keys: the keys that move the defaults, and the nested llama4
// form (text_config read, vision_config ignored).
func TestLlama4Keys(t *testing.T) {
	text := `{"model_type": "llama4_text", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
	  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 16,
	  "intermediate_size_mlp": 48, "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
	  "no_rope_layers": [1, 0, 1, 0, 1], "attention_chunk_size": 3, "use_qk_norm": false,
	  "attn_temperature_tuning": 4, "floor_scale": 2.0, "attn_scale": 0.5, "attention_bias": true}`
	for _, doc := range []string{text, `{"model_type": "llama4", "_source": "s", "vision_config": {"hidden_size": "not read"}, "text_config": ` + text + `}`} {
		c, err := ParseConfig([]byte(doc), "m")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(c.MoELayer, []bool{false, true, false, true}) || c.DenseFFN != 48 {
			t.Errorf("moe layers %v dense %d; want [f t f t] 48", c.MoELayer, c.DenseFFN)
		}
		if !reflect.DeepEqual(c.NoRope, []bool{false, true, false, true}) || !reflect.DeepEqual(c.Chunk, []int{3, 0, 3, 0}) {
			t.Errorf("no_rope %v chunk %v", c.NoRope, c.Chunk)
		}
		if c.QKNorm != moe.QKNormNone || *c.Temperature != (moe.AttnTemperature{FloorScale: 2, Scale: 0.5}) || !c.QKVBias || !c.OProjBias {
			t.Errorf("qk_norm %s temperature %v bias %v %v", c.QKNorm, c.Temperature, c.QKVBias, c.OProjBias)
		}
	}
	c, err := ParseConfig([]byte(smallLlama4+`, "num_key_value_heads": 2, "moe_layers": [2], "attn_temperature_tuning": false, "layer_types":
	  ["full_attention", "chunked_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention"]}`), "m")
	if err != nil {
		t.Fatal(err)
	}
	if c.MoELayers() != 1 || !c.MoELayer[2] || c.DenseFFN != 16384 || c.Temperature != nil || !reflect.DeepEqual(c.Chunk, []int{0, 8192, 0, 0, 0, 0, 0, 0}) {
		t.Errorf("moe_layers/layer_types/intermediate_size_mlp default: %+v", c)
	}
}

// TestLlama4Refusals: each bad key is refused naming it.
func TestLlama4Refusals(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{smallLlama4 + `, "no_rope_layers": [1, 2, 1, 1, 1, 1, 1, 1]}`, "no_rope_layers[1] = 2"},
		{smallLlama4 + `, "no_rope_layers": [1, 0]}`, "no_rope_layers has 2 entries"},
		{smallLlama4 + `, "no_rope_layer_interval": 0}`, "no_rope_layer_interval = 0"},
		{smallLlama4 + `, "attention_chunk_size": null}`, "attention_chunk_size is null"},
		{smallLlama4 + `, "attention_chunk_size": 0}`, "attention_chunk_size = 0"},
		{smallLlama4 + `, "floor_scale": 1.5}`, "floor_scale = 1.5"},
		{smallLlama4 + `, "attn_temperature_tuning": "yes"}`, "attn_temperature_tuning"},
		{smallLlama4 + `, "moe_layers": [8]}`, "moe_layers = 8"},
		{smallLlama4 + `, "interleave_moe_layer_step": 0}`, "interleave_moe_layer_step = 0"},
		{smallLlama4 + `, "layer_types": ["sliding_attention"]}`, "layer_types has 1 entries"},
		{`{"model_type": "llama4"}`, "text_config: required key is missing"},
		{`{"model_type": "llama4", "text_config": {"model_type": "llama4_text", "vocab_size": -1}}`, "vocab_size = -1"},
	} {
		if _, err := ParseConfig([]byte(tc.doc), "m"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %q", tc.doc, err, tc.want)
		}
	}
}

// TestLlama4BuiltinParams: the text checkpoints' parameters counted per
// tensor by hand from their configs (V 202048, D 5120, 48 layers, 40 q and
// 8 kv heads of 128, expert and shared-expert width 8192, dense width
// 16384): embedding and LM head V·D each, final norm D; per layer two norms
// 2D and q/k/v/o D·(5120+1024+1024) + 5120·D; an MoE layer adds the router
// E·D, E experts and one shared expert of 3·8192·D; a dense layer 3·16384·D.
// Scout: 16 experts, every layer MoE. Maverick: 128 experts on the odd
// layers, dense even ones. Active: one routed expert per MoE layer.
//
// Meta's model cards (huggingface.co/meta-llama/Llama-4-Scout-17B-16E and
// -Maverick-17B-128E) give 17B active and 109B / 400B total parameters,
// counting the vision encoder and projector, which moescope does not model:
// the text totals must lie at most 2B below the card's (Scout's gap of 1.23B
// is the vision tower; Maverick's card rounds 400.7B + its vision tower to
// 400B), and the active counts round to 17B.
func TestLlama4BuiltinParams(t *testing.T) {
	const V, D = 202048, 5120
	attn := int64(D*(5120+1024+1024) + 5120*D + 2*D)
	expert := int64(3 * 8192 * D)
	for _, tc := range []struct {
		name          string
		total, active int64
		card          float64
	}{
		{"llama-4-scout", 2*V*D + D + 48*(attn+16*D+16*expert+expert), 2*V*D + D + 48*(attn+16*D+2*expert), 109e9},
		{"llama-4-maverick", 2*V*D + D + 24*(attn+3*16384*D) + 24*(attn+128*D+128*expert+expert),
			2*V*D + D + 24*(attn+3*16384*D) + 24*(attn+128*D+2*expert), 400e9},
	} {
		c, err := Load(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		total, active := countParams(c)
		if total != tc.total || active != tc.active {
			t.Errorf("%s: total %d active %d, want %d %d", tc.name, total, active, tc.total, tc.active)
		}
		if gap := tc.card - float64(total); gap > 2e9 || gap < -1e9 {
			t.Errorf("%s: text total %d vs card %.0f: gap %.3g outside the vision tower's [-1e9, 2e9]", tc.name, total, tc.card, gap)
		}
		if math.Round(float64(active)/1e9) != 17 {
			t.Errorf("%s: active %d does not round to the card's 17B", tc.name, active)
		}
	}
}

// TestLlama4ParamNames: layer tensors under Llama 4's module names
// (feed_forward.router, feed_forward.experts.gate_up_proj,
// feed_forward.shared_expert.*, a dense feed_forward.*), as
// Llama4TextDecoderLayer declares them; the L2 QK-norm has no weight.
func TestLlama4ParamNames(t *testing.T) {
	c, err := ParseConfig([]byte(smallLlama4+`, "num_key_value_heads": 2, "head_dim": 8, "moe_layers": [1], "intermediate_size_mlp": 24}`), "m")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]int{}
	for _, p := range c.Params() {
		if p.Layer == 0 || p.Layer == 1 {
			got[p.Name] = p.Shape
		}
	}
	want := map[string][]int{}
	for l, f := range []string{"model.layers.0.feed_forward.", "model.layers.1.feed_forward."} {
		a := "model.layers." + string(rune('0'+l)) + "."
		want[a+"input_layernorm.weight"], want[a+"post_attention_layernorm.weight"] = []int{32}, []int{32}
		want[a+"self_attn.q_proj.weight"], want[a+"self_attn.k_proj.weight"] = []int{32, 32}, []int{16, 32}
		want[a+"self_attn.v_proj.weight"], want[a+"self_attn.o_proj.weight"] = []int{16, 32}, []int{32, 32}
		if l == 0 {
			want[f+"gate_proj.weight"], want[f+"up_proj.weight"], want[f+"down_proj.weight"] = []int{24, 32}, []int{24, 32}, []int{32, 24}
			continue
		}
		want[f+"router.weight"] = []int{4, 32}
		want[f+"shared_expert.gate_proj.weight"], want[f+"shared_expert.up_proj.weight"] = []int{16, 32}, []int{16, 32}
		want[f+"shared_expert.down_proj.weight"] = []int{32, 16}
		for e := range 4 {
			s := "[" + string(rune('0'+e)) + "]"
			want[f+"experts.gate_up_proj"+s], want[f+"experts.down_proj"+s] = []int{32, 32}, []int{16, 32}
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("layer 0-1 tensors:\n got %v\nwant %v", got, want)
	}
}
