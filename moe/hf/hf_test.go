package hf

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/ref"
)

// minimal is a valid qwen3_moe config.json used as the base of edits below.
const minimal = `{
  "model_type": "qwen3_moe",
  "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
  "intermediate_size": 48, "moe_intermediate_size": 16,
  "num_experts": 4, "num_experts_per_tok": 2
}`

func TestParseHFDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(minimal), "m")
	if err != nil {
		t.Fatal(err)
	}
	// Qwen3MoeConfig defaults: rms_norm_eps 1e-6, rope_theta 10000,
	// norm_topk_prob false, router_aux_loss_coef 0.001, initializer_range 0.02.
	if c.NormEps != 1e-6 || c.RopeTheta != 10000 || c.NormTopK || c.AuxLossCoef != 0.001 || c.InitRange != 0.02 {
		t.Errorf("defaults: eps %g theta %g normtopk %v aux %g init %g", c.NormEps, c.RopeTheta, c.NormTopK, c.AuxLossCoef, c.InitRange)
	}
	if c.QKNorm != moe.QKNormHead || c.Score != moe.Softmax || c.RoutedScale != 1 || c.Groups != 1 || c.RotaryFraction != 1 {
		t.Errorf("qk %v score %v scale %g groups %d rot %g", c.QKNorm, c.Score, c.RoutedScale, c.Groups, c.RotaryFraction)
	}
	if !reflect.DeepEqual(c.MoELayer, []bool{true, true, true, true}) || !reflect.DeepEqual(c.Window, []int{0, 0, 0, 0}) {
		t.Errorf("moe %v window %v", c.MoELayer, c.Window)
	}
}

func edit(t *testing.T, extra string) (*moe.Config, error) {
	t.Helper()
	s := strings.TrimSuffix(strings.TrimSpace(minimal), "}") + "," + extra + "}"
	return ParseConfig([]byte(s), "m")
}

func TestParseHFLayerPattern(t *testing.T) {
	for _, tc := range []struct {
		extra string
		moe   []bool
		win   []int
	}{
		// HF Qwen3MoeDecoderLayer: MoE iff i ∉ mlp_only_layers and (i+1) % step == 0.
		{`"decoder_sparse_step": 2`, []bool{false, true, false, true}, []int{0, 0, 0, 0}},
		{`"mlp_only_layers": [0, 3]`, []bool{false, true, true, false}, []int{0, 0, 0, 0}},
		// Sliding from max_window_layers on, only when use_sliding_window.
		{`"use_sliding_window": true, "sliding_window": 7, "max_window_layers": 2`, []bool{true, true, true, true}, []int{0, 0, 7, 7}},
		{`"use_sliding_window": false, "sliding_window": 7, "max_window_layers": 2`, []bool{true, true, true, true}, []int{0, 0, 0, 0}},
		// Qwen3MoeConfig defaults: sliding_window 4096, max_window_layers 28
		// (beyond these 4 layers); an explicit null disables the window.
		{`"use_sliding_window": true, "max_window_layers": 3`, []bool{true, true, true, true}, []int{0, 0, 0, 4096}},
		{`"use_sliding_window": true, "sliding_window": null, "max_window_layers": 3`, []bool{true, true, true, true}, []int{0, 0, 0, 0}},
		{`"use_sliding_window": true, "sliding_window": 9`, []bool{true, true, true, true}, []int{0, 0, 0, 0}},
		{`"sliding_window": 5, "layer_types": ["sliding_attention","full_attention","sliding_attention","full_attention"]`, []bool{true, true, true, true}, []int{5, 0, 5, 0}},
	} {
		c, err := edit(t, tc.extra)
		if err != nil {
			t.Errorf("%s: %v", tc.extra, err)
			continue
		}
		if !reflect.DeepEqual(c.MoELayer, tc.moe) || !reflect.DeepEqual(c.Window, tc.win) {
			t.Errorf("%s: moe %v window %v, want %v %v", tc.extra, c.MoELayer, c.Window, tc.moe, tc.win)
		}
	}
}

func TestParseHFErrors(t *testing.T) {
	for _, tc := range []struct {
		json string
		want []string
	}{
		{"{\n  \"model_type\": \"qwen3_moe\",\n  \"vocab_size\": 64,,\n}", []string{"line 3, column 20"}},
		{"{\n \"model_type\": \"qwen3_moe\",\n \"vocab_size\": \"big\"\n}", []string{"line 3", "vocab_size", "string"}},
		{`{"model_type": "jamba"}`, []string{`"jamba" is not supported`, "glm4_moe", "qwen3_moe", "llama"}},
		{`{"vocab_size": 3}`, []string{"model_type is missing"}},
		// Errors speak of JSON, not of the Go types it decodes into.
		{`[{"model_type": "llama"}]`, []string{"must be a JSON object, found a JSON array"}},
		{"{\n \"model_type\": \"qwen3_moe\",\n \"hidden_size\": 32.5\n}", []string{"line 3", `key "hidden_size" holds a JSON number 32.5, want an integer`}},
		{"{\n \"model_type\": \"qwen3_moe\",\n \"norm_topk_prob\": 1\n}", []string{"line 3", `key "norm_topk_prob" holds a JSON number, want true or false`}},
		{`{"model_type": "llama"}`, []string{"vocab_size: required", "hidden_size: required", "num_hidden_layers: required", "intermediate_size: required"}},
		{strings.Replace(minimal, `"num_experts_per_tok": 2`, `"num_experts_per_tok": 5`, 1), []string{"top_k = 5"}},
		{strings.Replace(minimal, `"num_key_value_heads": 2`, `"num_key_value_heads": 3`, 1), []string{"kv_heads = 3", "must divide heads = 4"}},
		// Several violations are all reported.
		{strings.Replace(strings.Replace(minimal, `"hidden_size": 32`, `"hidden_size": -1`, 1), `"vocab_size": 64`, `"vocab_size": 0`, 1), []string{"vocab = 0", "hidden = -1"}},
		{strings.Replace(minimal, `"num_hidden_layers": 4`, `"num_hidden_layers": 9999999999`, 1), []string{"layers = 9999999999"}},
		// Params would list up to 3 + 20·4 + 3·87382·4 = 1,048,667 tensors,
		// past 2^20 = 1,048,576 (TestTensorCap pins the boundary); 70000
		// layers of 4 experts: 3 + 20·70000 + 12·70000 = 2,240,003.
		{strings.Replace(minimal, `"num_experts": 4`, `"num_experts": 87382`, 1), []string{"layers, experts = 4, 87382 (4 MoE layers)", "up to 1048667 parameter tensors; at most 1048576"}},
		{strings.Replace(minimal, `"num_hidden_layers": 4`, `"num_hidden_layers": 70000`, 1), []string{"layers, experts = 70000, 4", "up to 2240003 parameter tensors"}},
		{strings.Replace(minimal, `"num_hidden_layers": 4`, `"num_hidden_layers": 4, "mlp_only_layers": [7]`, 1), []string{"mlp_only_layers = 7"}},
		{strings.Replace(minimal, `"num_hidden_layers": 4`, `"num_hidden_layers": 4, "attention_bias": true`, 1), []string{"attention_bias = true", "o_proj"}},
		{strings.Replace(minimal, `"num_hidden_layers": 4`, `"num_hidden_layers": 4, "hidden_act": "gelu"`, 1), []string{"hidden_act = gelu"}},
		{strings.Replace(minimal, `"num_hidden_layers": 4`, `"num_hidden_layers": 4, "layer_types": ["full_attention"]`, 1), []string{"layer_types has 1 entries"}},
	} {
		_, err := ParseConfig([]byte(tc.json), "m")
		if err == nil {
			t.Errorf("%s: no error", tc.json)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q lacks %q", tc.json, err, w)
			}
		}
	}
}

func TestLoad(t *testing.T) {
	_, err := Load("no-such-model")
	if err == nil || !strings.Contains(err.Error(), "qwen3-30b-a3b") || !strings.Contains(err.Error(), "tiny") {
		t.Errorf("unknown model error should list the built-ins: %v", err)
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "config.json")
	if err := os.WriteFile(p, []byte(minimal), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	if err != nil || c.Name != p || c.Layers != 4 {
		t.Fatalf("Load(%s) = %+v, %v", p, c, err)
	}
	if err := os.WriteFile(p, []byte("{\n\"model_type\": }"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("malformed file: %v", err)
	}
	// An endless file (a device, a pipe) is cut off, not read forever.
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, make([]byte, maxConfigBytes+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "larger than 1048576 bytes") {
		t.Errorf("oversized file: %v", err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "a directory, not a regular file") {
		t.Errorf("directory: %v", err)
	}
}

// FuzzParseHF: no input panics or hangs; an accepted config validates and
// lists parameters whose count fits in int64.
func FuzzParseHF(f *testing.F) {
	f.Add([]byte(minimal))
	for _, n := range Builtins() {
		data, _ := builtinJSON(n)
		f.Add(data)
	}
	f.Add([]byte(`{"model_type":"deepseek","n_routed_experts":0}`))
	f.Add([]byte(`{"model_type":"glm4_moe","n_group":0}`))
	f.Add([]byte(`[1,2`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data, "fuzz")
		if err != nil {
			if c != nil {
				t.Fatal("config returned with an error")
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted config does not validate: %v", err)
		}
		if c.Layers > 64 || c.Experts > 64 {
			return // keep Params cheap
		}
		_ = c.Params()
	})
}

func TestParseHFModelTypes(t *testing.T) {
	// qwen2_moe: one gated shared expert, q/k/v biases, no QK-norm.
	c, err := ParseConfig([]byte(`{"model_type":"qwen2_moe","vocab_size":64,"hidden_size":32,"num_hidden_layers":2,
		"num_attention_heads":4,"intermediate_size":48,"moe_intermediate_size":16,"num_experts":4,
		"num_experts_per_tok":2,"shared_expert_intermediate_size":40}`), "q2")
	if err != nil {
		t.Fatal(err)
	}
	if c.SharedExperts != 1 || c.SharedFFN != 40 || !c.SharedGated || !c.QKVBias || c.QKNorm != moe.QKNormNone || c.KVHeads != 4 || c.HeadDim != 8 {
		t.Errorf("qwen2_moe: %+v", c)
	}
	// glm4_moe: sigmoid + bias, grouped top-k, scaling, QK-norm when asked,
	// dense first layers, partial rotary default 0.5, q/k/v bias only.
	c, err = ParseConfig([]byte(`{"model_type":"glm4_moe","vocab_size":64,"hidden_size":32,"num_hidden_layers":4,
		"num_attention_heads":4,"num_key_value_heads":2,"head_dim":8,"intermediate_size":48,"moe_intermediate_size":16,
		"n_routed_experts":8,"num_experts_per_tok":2,"n_shared_experts":2,"first_k_dense_replace":2,
		"n_group":4,"topk_group":2,"routed_scaling_factor":2.5,"use_qk_norm":true,"attention_bias":true}`), "glm")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.MoELayer, []bool{false, false, true, true}) || c.Score != moe.Sigmoid || !c.SelectionBias ||
		c.Groups != 4 || c.TopKGroups != 2 || c.RoutedScale != 2.5 || c.QKNorm != moe.QKNormHead || c.RotaryFraction != 0.5 ||
		!c.QKVBias || c.SharedExperts != 2 || c.SharedFFN != 16 || !c.NormTopK {
		t.Errorf("glm4_moe: %+v", c)
	}
	// deepseek: moe_layer_freq 2 from first_k_dense_replace 1 -> MoE at 2, 4.
	c, err = ParseConfig([]byte(`{"model_type":"deepseek","vocab_size":64,"hidden_size":32,"num_hidden_layers":5,
		"num_attention_heads":4,"intermediate_size":48,"moe_intermediate_size":16,"n_routed_experts":4,
		"num_experts_per_tok":2,"n_shared_experts":1,"first_k_dense_replace":1,"moe_layer_freq":2,"aux_loss_alpha":0}`), "ds")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.MoELayer, []bool{false, false, true, false, true}) || c.OutputRouterLogits || c.AuxLossCoef != 0 {
		t.Errorf("deepseek: %+v", c)
	}
	// mixtral: sliding_window applies to every layer.
	c, err = ParseConfig([]byte(`{"model_type":"mixtral","vocab_size":64,"hidden_size":32,"num_hidden_layers":2,
		"num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":16,"num_local_experts":4,
		"num_experts_per_tok":2,"sliding_window":5,"rope_parameters":{"rope_theta":123.0}}`), "mx")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Window, []int{5, 5}) || c.ExpertFFN != 16 || c.DenseFFN != 0 || c.RopeTheta != 123 {
		t.Errorf("mixtral: %+v", c)
	}
	// llama: dense, head_dim = hidden / heads, tied embeddings honoured.
	c, err = ParseConfig([]byte(`{"model_type":"llama","vocab_size":64,"hidden_size":32,"num_hidden_layers":2,
		"num_attention_heads":4,"intermediate_size":48,"tie_word_embeddings":true}`), "ll")
	if err != nil {
		t.Fatal(err)
	}
	if c.IsMoE() || c.HeadDim != 8 || !c.TiedEmbeddings || c.QKNorm != moe.QKNormNone {
		t.Errorf("llama: %+v", c)
	}
	// olmoe with clip_qkv is refused rather than silently mis-modelled.
	if _, err := ParseConfig([]byte(`{"model_type":"olmoe","vocab_size":64,"hidden_size":32,"num_hidden_layers":2,
		"num_attention_heads":4,"intermediate_size":16,"num_experts":4,"num_experts_per_tok":2,"clip_qkv":8}`), "ol"); err == nil || !strings.Contains(err.Error(), "clip_qkv") {
		t.Errorf("olmoe clip_qkv: %v", err)
	}
}

// TestTensorCap: the largest expert count under the 2^20-tensor bound for
// four MoE layers is 87374 (3 + 20·4 + 12·87374 = 1,048,571 ≤ 1,048,576;
// 87375 gives 1,048,583), and published shapes are far below it
// (DeepSeek-V3-like 61 layers of 256 experts: 3 + 20·61 + 3·256·61 = 48,071).
func TestTensorCap(t *testing.T) {
	for _, tc := range []struct {
		layers, experts int
		ok              bool
	}{{4, 87374, true}, {4, 87375, false}, {61, 256, true}} {
		c, err := ParseConfig([]byte(minimal), "m")
		if err != nil {
			t.Fatal(err)
		}
		c.Layers, c.Experts = tc.layers, tc.experts
		c.MoELayer, c.Window = make([]bool, tc.layers), make([]int, tc.layers)
		for l := range c.MoELayer {
			c.MoELayer[l] = true
		}
		err = c.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%d layers × %d experts: %v, want ok = %v", tc.layers, tc.experts, err, tc.ok)
		}
	}
}

// TestRopeScaling: rope_scaling (older "type" or "rope_type") and
// transformers-5 rope_parameters are recorded; the reference model refuses
// every type but yarn (it rotates with plain or YaRN frequencies), while
// parsing, and so the accounting, accepts the config.
func TestRopeScaling(t *testing.T) {
	for _, tc := range []struct{ extra, want string }{
		{`"rope_scaling": null`, ""},
		{`"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}`, "llama3"},
		{`"rope_scaling": {"type": "linear", "factor": 2.0}`, "linear"},
		{`"rope_parameters": {"rope_type": "default", "rope_theta": 500000}`, ""},
		{`"rope_parameters": {"rope_type": "yarn", "rope_theta": 500000, "factor": 4, "original_max_position_embeddings": 4096}`, "yarn"},
	} {
		c, err := ParseConfig([]byte(strings.Replace(minimal, `"num_experts": 4`, `"num_experts": 4, `+tc.extra, 1)), "m")
		if err != nil {
			t.Fatalf("%s: %v", tc.extra, err)
		}
		if c.RopeScaling != tc.want {
			t.Errorf("%s: rope scaling %q, want %q", tc.extra, c.RopeScaling, tc.want)
		}
		_, err = ref.NewModel[float32](c)
		if (tc.want == "" || tc.want == "yarn") && err != nil {
			t.Errorf("%s: NewModel: %v", tc.extra, err)
		}
		if tc.want != "" && tc.want != "yarn" && (err == nil || !strings.Contains(err.Error(), `rope_type "`+tc.want+`" is not implemented`)) {
			t.Errorf("%s: NewModel error %v", tc.extra, err)
		}
	}
}

// TestYarnKeys: YaRN's keys read as transformers' _compute_yarn_parameters
// reads them (26892c16): defaults β_fast 32, β_slow 1 (also for 0),
// truncate true, original_max_position_embeddings from
// max_position_embeddings; attention_factor given, or
// m(f, mscale)/m(f, mscale_all_dim) with m(s, k) = 0.1·k·ln s + 1 when both
// are non-zero, else m(f, 1) (values by hand: ln 4 = 1.3863).
func TestYarnKeys(t *testing.T) {
	ln4 := math.Log(4)
	for _, tc := range []struct {
		extra string
		want  moe.Yarn
	}{
		{`"max_position_embeddings": 512, "rope_scaling": {"type": "yarn", "factor": 4}`,
			moe.Yarn{Factor: 4, OriginalMaxPositions: 512, BetaFast: 32, BetaSlow: 1, Truncate: true, AttentionFactor: 0.1*ln4 + 1}},
		{`"rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64, "beta_fast": 0, "beta_slow": 0, "mscale": 1, "mscale_all_dim": 0.5, "truncate": false}`,
			moe.Yarn{Factor: 4, OriginalMaxPositions: 64, BetaFast: 32, BetaSlow: 1, AttentionFactor: (0.1*ln4 + 1) / (0.05*ln4 + 1)}},
		{`"rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64, "beta_fast": 8, "beta_slow": 2, "mscale": 0.5, "attention_factor": 1.25}`,
			moe.Yarn{Factor: 4, OriginalMaxPositions: 64, BetaFast: 8, BetaSlow: 2, Truncate: true, AttentionFactor: 1.25}},
		{`"rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64, "mscale": 0.5}`,
			moe.Yarn{Factor: 4, OriginalMaxPositions: 64, BetaFast: 32, BetaSlow: 1, Truncate: true, AttentionFactor: 0.1*ln4 + 1}},
	} {
		c, err := ParseConfig([]byte(strings.Replace(minimal, `"num_experts": 4`, `"num_experts": 4, `+tc.extra, 1)), "m")
		if err != nil {
			t.Fatalf("%s: %v", tc.extra, err)
		}
		if c.Yarn == nil || math.Abs(c.Yarn.AttentionFactor-tc.want.AttentionFactor) > 1e-15 {
			t.Fatalf("%s: yarn %+v, want %+v", tc.extra, c.Yarn, tc.want)
		}
		got := *c.Yarn
		got.AttentionFactor = tc.want.AttentionFactor
		if got != tc.want {
			t.Errorf("%s: yarn %+v, want %+v", tc.extra, got, tc.want)
		}
	}
	for _, tc := range []struct{ extra, want string }{
		{`"rope_scaling": {"type": "yarn", "original_max_position_embeddings": 64}`, "rope_scaling.factor: required key is missing"},
		{`"rope_scaling": {"type": "yarn", "factor": 4}`, "rope_scaling.original_max_position_embeddings: required key is missing"},
		{`"rope_scaling": {"type": "yarn", "factor": -4, "original_max_position_embeddings": 64}`, "yarn.factor"},
		{`"rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 0}`, "yarn.original_max_position_embeddings"},
		{`"rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64, "beta_slow": -1}`, "yarn.beta_slow"},
		{`"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "original_max_position_embeddings": 64}`, "rope_parameters.factor: required key is missing"},
	} {
		_, err := ParseConfig([]byte(strings.Replace(minimal, `"num_experts": 4`, `"num_experts": 4, `+tc.extra, 1)), "m")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %s", tc.extra, err, tc.want)
		}
	}
}

// TestParseHFBehaviourFields: behaviour that differs between model types
// is normalized into Config fields at load, as each modeling file implies:
//   - NormTopKEps: the 1e-20 added to the top-k sum in glm4_moe's
//     Glm4MoeMoE.route_tokens_to_experts (modeling_glm4_moe.py, transformers
//     commit 000c33fd) and DeepSeek-MoE's MoEGate (modeling_deepseek.py);
//     Qwen3-MoE, Qwen2-MoE, Mixtral and OLMoE divide by the plain sum.
//   - SeqAuxLoss: MoEGate's per-sequence aux loss (seq_aux, default true).
//   - Names: Mixtral's block_sparse_moe with w1/w3/w2 experts
//     (modeling_mixtral.py, commit 00d4b3d2), Qwen2-MoE's shared_expert
//     (modeling_qwen2_moe.py, commit 1c351314).
//   - IgnoreExtraLayers: Glm4MoeModel._keys_to_ignore_on_load_unexpected.
//
// One config.json body serves every type: each reads only its own keys.
func TestParseHFBehaviourFields(t *testing.T) {
	mixtral := moe.TensorNames{MoE: "block_sparse_moe", ExpertGate: "w1", ExpertUp: "w3", ExpertDown: "w2"}
	llama4Names := moe.TensorNames{MoE: "feed_forward", Router: "router", Shared: "shared_expert", Dense: "feed_forward"}
	want := map[string]struct {
		eps    float64
		seqAux bool
		names  moe.TensorNames
		ignore bool
		expert string // layer 1's first routed-expert tensor ("" for dense models)
	}{
		"qwen3_moe": {expert: "model.layers.1.mlp.experts.0.gate_proj.weight"},
		"qwen2_moe": {names: moe.TensorNames{Shared: "shared_expert"}, expert: "model.layers.1.mlp.experts.0.gate_proj.weight"},
		"mixtral":   {names: mixtral, expert: "model.layers.1.block_sparse_moe.experts.0.w1.weight"},
		"olmoe":     {expert: "model.layers.1.mlp.experts.0.gate_proj.weight"},
		"deepseek":  {eps: 1e-20, seqAux: true, expert: "model.layers.1.mlp.experts.0.gate_proj.weight"},
		"glm4_moe":  {eps: 1e-20, ignore: true, expert: "model.layers.1.mlp.experts.0.gate_proj.weight"},
		"qwen3":     {},
		"llama":     {},
		// DeepseekV3TopkRouter adds 1e-20; DeepseekV3Config's
		// first_k_dense_replace defaults to 3, so both layers are dense;
		// DeepseekV2Moe never renormalizes. Both skip the MTP layers.
		"deepseek_v3": {eps: 1e-20, ignore: true},
		"kimi_k2":     {eps: 1e-20, ignore: true},
		"deepseek_v2": {ignore: true, expert: "model.layers.1.mlp.experts.0.gate_proj.weight"},
		// GptOssMLP.router and the stacked GptOssExperts tensors
		// (modeling_gpt_oss.py, transformers 00d4b3d2): expert 0's slice.
		"gpt_oss": {names: moe.TensorNames{Router: "router"}, expert: "model.layers.1.mlp.experts.gate_up_proj[0]"},
		// Llama4TextDecoderLayer.feed_forward (modeling_llama4.py,
		// transformers 000c33fd); llama4 reads the body as its text_config.
		"llama4":      {names: llama4Names, expert: "model.layers.1.feed_forward.experts.gate_up_proj[0]"},
		"llama4_text": {names: llama4Names, expert: "model.layers.1.feed_forward.experts.gate_up_proj[0]"},
	}
	const body = `"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
		"intermediate_size": 48, "moe_intermediate_size": 16, "num_experts": 4, "num_local_experts": 4,
		"n_routed_experts": 4, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 2,
		"shared_expert_intermediate_size": 40, "norm_topk_prob": true`
	for _, mt := range SupportedModelTypes() {
		w, ok := want[mt]
		if !ok {
			t.Errorf("model_type %s has no expectation here", mt)
			continue
		}
		doc := `{"model_type": "` + mt + `", ` + body + `}`
		switch mt { // Llama4TextConfig's 8 KV heads would not divide 4 heads
		case "llama4":
			doc = `{"model_type": "llama4", "text_config": {"num_key_value_heads": 2, ` + body + `}}`
		case "llama4_text":
			doc = `{"model_type": "llama4_text", "num_key_value_heads": 2, ` + body + `}`
		}
		c, err := ParseConfig([]byte(doc), mt)
		if err != nil {
			t.Errorf("%s: %v", mt, err)
			continue
		}
		if c.NormTopKEps != w.eps || c.SeqAuxLoss != w.seqAux || c.Names != w.names || c.IgnoreExtraLayers != w.ignore {
			t.Errorf("%s: norm_topk_eps %g, seq_aux_loss %v, names %+v, ignore_extra_layers %v; want %g, %v, %+v, %v",
				mt, c.NormTopKEps, c.SeqAuxLoss, c.Names, c.IgnoreExtraLayers, w.eps, w.seqAux, w.names, w.ignore)
		}
		var expert string
		for _, p := range c.Params() {
			if p.Layer == 1 && p.Expert == 0 {
				expert = p.Name
				break
			}
		}
		if expert != w.expert {
			t.Errorf("%s: first expert tensor %q, want %q", mt, expert, w.expert)
		}
	}
	names := map[string]bool{}
	q2, err := ParseConfig([]byte(`{"model_type": "qwen2_moe", `+body+`}`), "q2")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range q2.Params() {
		names[p.Name] = true
	}
	for _, n := range []string{"model.layers.0.mlp.shared_expert.gate_proj.weight", "model.layers.0.mlp.shared_expert_gate.weight"} {
		if !names[n] {
			t.Errorf("qwen2_moe lacks %s", n)
		}
	}
}

// TestParseHFDeepseekRouting: MoEGate renormalizes only when top_k > 1
// (`if self.top_k > 1 and self.norm_topk_prob`), so NormTopK is false for
// top_k = 1 whatever norm_topk_prob says; its batch-level aux loss
// (seq_aux = false) is refused only when it would be added.
func TestParseHFDeepseekRouting(t *testing.T) {
	ds := func(extra string) (*moe.Config, error) {
		return ParseConfig([]byte(`{"model_type": "deepseek", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
			"num_attention_heads": 4, "intermediate_size": 48, "moe_intermediate_size": 16, "n_routed_experts": 4, `+extra+`}`), "ds")
	}
	for _, tc := range []struct {
		extra string
		norm  bool
	}{
		{`"num_experts_per_tok": 1, "norm_topk_prob": true`, false},
		{`"num_experts_per_tok": 2, "norm_topk_prob": true`, true},
		{`"num_experts_per_tok": 2, "norm_topk_prob": false`, false},
		{`"num_experts_per_tok": 2`, false}, // DeepseekConfig default norm_topk_prob = False
	} {
		c, err := ds(tc.extra)
		if err != nil {
			t.Fatalf("%s: %v", tc.extra, err)
		}
		if c.NormTopK != tc.norm {
			t.Errorf("%s: norm_topk %v, want %v", tc.extra, c.NormTopK, tc.norm)
		}
	}
	if _, err := ds(`"num_experts_per_tok": 2, "seq_aux": false`); err == nil || !strings.Contains(err.Error(), "seq_aux = false") {
		t.Errorf("seq_aux false with the default aux_loss_alpha 0.001: %v", err)
	}
	if _, err := ds(`"num_experts_per_tok": 2, "seq_aux": false, "aux_loss_alpha": 0`); err != nil {
		t.Errorf("seq_aux false without an aux loss: %v", err)
	}
}

// TestValidateNormTopKEps: the renormalization ε must be a finite number ≥ 0.
func TestValidateNormTopKEps(t *testing.T) {
	for _, eps := range []float64{-1e-20, math.NaN(), math.Inf(1)} {
		c, err := ParseConfig([]byte(minimal), "m")
		if err != nil {
			t.Fatal(err)
		}
		c.NormTopKEps = eps
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "norm_topk_eps") {
			t.Errorf("norm_topk_eps %v: %v", eps, err)
		}
	}
}

// TestHFNegativeExpertsRefused (issue 17, defect 11): "num_experts": -1 in a
// qwen3_moe config made every layer dense (MoE needs num_experts > 0) and
// was accepted; every negative integer key is now an error naming it, even
// where it would otherwise be ignored (a dense model_type's expert keys) or
// read as "none" (n_shared_experts).
func TestHFNegativeExpertsRefused(t *testing.T) {
	for _, tc := range []struct{ from, to, want string }{
		{`"num_experts": 4`, `"num_experts": -1`, "num_experts = -1: must be ≥ 0"},
		{`"moe_intermediate_size": 16`, `"moe_intermediate_size": -16`, "moe_intermediate_size = -16: must be ≥ 0"},
		{`"num_key_value_heads": 2`, `"num_key_value_heads": -2`, "num_key_value_heads = -2"},
		{`"head_dim": 8`, `"head_dim": -8`, "head_dim = -8"},
		{`"num_experts": 4`, `"num_experts": 4, "mlp_only_layers": [1, -1]`, "mlp_only_layers[1] = -1: must be ≥ 0"},
		{`"num_experts": 4`, `"num_experts": 4, "max_window_layers": -3`, "max_window_layers = -3"},
		{`"num_experts": 4`, `"num_experts": 4, "decoder_sparse_step": -1`, "decoder_sparse_step = -1: must be ≥ 0"},
		{`"model_type": "qwen3_moe"`, `"model_type": "qwen3"`, "num_experts = -1"}, // a dense type ignores num_experts
	} {
		doc := strings.Replace(minimal, tc.from, tc.to, 1)
		if strings.Contains(tc.to, `"qwen3"`) {
			doc = strings.Replace(doc, `"num_experts": 4`, `"num_experts": -1`, 1)
		}
		if doc == minimal {
			t.Fatalf("%s not in minimal", tc.from)
		}
		if _, err := ParseConfig([]byte(doc), "m"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.to, err, tc.want)
		}
	}
	ds := `{"model_type": "deepseek", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
		"intermediate_size": 48, "moe_intermediate_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": -1}`
	if _, err := ParseConfig([]byte(ds), "m"); err == nil || !strings.Contains(err.Error(), "n_shared_experts = -1") {
		t.Errorf("deepseek n_shared_experts -1: %v", err)
	}
	// 0 keeps its meaning: no experts, a dense qwen3_moe (transformers').
	c, err := ParseConfig([]byte(strings.Replace(minimal, `"num_experts": 4`, `"num_experts": 0`, 1)), "m")
	if err != nil || c.IsMoE() {
		t.Errorf("num_experts 0: %v, MoE %v", err, err == nil && c.IsMoE())
	}
}
