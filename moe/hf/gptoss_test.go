package hf

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
)

// smallGPTOSS is a gpt_oss config.json with the required keys only: every
// other field takes GptOssConfig's default (configuration_gpt_oss.py,
// transformers 02b8f42b).
const smallGPTOSS = `{"model_type": "gpt_oss", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 16,
  "num_local_experts": 4, "num_experts_per_tok": 2}`

// TestGPTOSSConfig: the behaviour of GptOssAttention, GptOssTopKRouter and
// GptOssExperts (modeling_gpt_oss.py, transformers 00d4b3d2) lands in
// Config fields, and absent keys take GptOssConfig's defaults: sliding
// window 128 on even layers, attention_bias true, rope_theta 150000, YaRN
// factor 32 with β 32 / 1 over 4096 positions, truncate false, and the
// clamped SwiGLU's α 1.702 and limit 7. YaRN's attention factor is
// 0.1·ln 32 + 1 (_compute_yarn_parameters, as moe.Yarn documents).
func TestGPTOSSConfig(t *testing.T) {
	c, err := ParseConfig([]byte(smallGPTOSS), "small")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Window, []int{128, 0, 128, 0}) || c.MoELayers() != 4 || c.DenseFFN != 0 {
		t.Errorf("windows %v, %d MoE layers, dense_ffn %d; want [128 0 128 0], 4, 0", c.Window, c.MoELayers(), c.DenseFFN)
	}
	if !c.QKVBias || !c.OProjBias || !c.AttnSinks || !c.RouterBias || !c.ExpertBias || !c.FusedExperts {
		t.Errorf("biases/sinks/fused: %+v", c)
	}
	if c.Score != moe.Softmax || !c.NormTopK || c.NormTopKEps != 0 || c.SelectionBias {
		t.Errorf("router: score %s norm_topk %v eps %g selection_bias %v; want softmax over the top-k logits", c.Score, c.NormTopK, c.NormTopKEps, c.SelectionBias)
	}
	if c.Clamp == nil || *c.Clamp != (moe.SwiGLUClamp{Alpha: 1.702, Limit: 7}) {
		t.Errorf("clamp %+v, want α 1.702 limit 7", c.Clamp)
	}
	y := c.Yarn
	if c.RopeTheta != 150000 || c.RopeScaling != "yarn" || y == nil || y.Factor != 32 || y.BetaFast != 32 || y.BetaSlow != 1 ||
		y.OriginalMaxPositions != 4096 || y.Truncate || math.Abs(y.AttentionFactor-(0.1*math.Log(32)+1)) > 1e-15 {
		t.Errorf("rope θ %g %q yarn %+v", c.RopeTheta, c.RopeScaling, y)
	}
	if c.NormEps != 1e-5 || c.AuxLossCoef != 0.001 || c.OutputRouterLogits || c.TiedEmbeddings {
		t.Errorf("norm_eps %g aux %g output_router_logits %v tied %v", c.NormEps, c.AuxLossCoef, c.OutputRouterLogits, c.TiedEmbeddings)
	}
}

// TestGPTOSSKeys: the keys a file may set instead of the defaults.
func TestGPTOSSKeys(t *testing.T) {
	with := func(extra string) string {
		return strings.Replace(smallGPTOSS, `"vocab_size"`, extra+`, "vocab_size"`, 1)
	}
	c, err := ParseConfig([]byte(with(`"attention_bias": false, "swiglu_alpha": 2, "swiglu_limit": 5, "sliding_window": 3,
		"layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
		"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 8, "original_max_position_embeddings": 64}`)), "m")
	if err != nil {
		t.Fatal(err)
	}
	if c.QKVBias || c.OProjBias || !c.AttnSinks || *c.Clamp != (moe.SwiGLUClamp{Alpha: 2, Limit: 5}) ||
		!reflect.DeepEqual(c.Window, []int{0, 3, 3, 0}) || c.RopeTheta != 1e4 || c.Yarn.Factor != 8 || !c.Yarn.Truncate {
		t.Errorf("keys not read: %+v yarn %+v", c, c.Yarn)
	}
	for _, tc := range []struct{ extra, want string }{
		{`"sliding_window": null`, "sliding_window is null but layer_types is absent"},
		{`"sliding_window": 0`, "sliding_window = 0"},
		{`"swiglu_limit": -1`, "swiglu_clamp.limit"},
		{`"swiglu_alpha": 0`, "swiglu_clamp.alpha"},
		{`"layer_types": ["full_attention"]`, "layer_types has 1 entries"},
	} {
		if _, err := ParseConfig([]byte(with(tc.extra)), "m"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %s", tc.extra, err, tc.want)
		}
	}
}

// TestGPTOSSParamNames: the tensors GPT-OSS's checkpoint names (its
// safetensors index; torchtitan's GptOssStateDictAdapter at b5bcd76 maps
// the same keys), the stacked experts listed per expert.
func TestGPTOSSParamNames(t *testing.T) {
	c, err := ParseConfig([]byte(smallGPTOSS), "small")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]int{}
	for _, p := range c.Params() {
		if p.Layer == 0 {
			got[p.Name] = p.Shape
		}
	}
	a, m := "model.layers.0.self_attn.", "model.layers.0.mlp."
	want := map[string][]int{
		"model.layers.0.input_layernorm.weight": {32}, "model.layers.0.post_attention_layernorm.weight": {32},
		a + "q_proj.weight": {32, 32}, a + "q_proj.bias": {32}, a + "k_proj.weight": {16, 32}, a + "k_proj.bias": {16},
		a + "v_proj.weight": {16, 32}, a + "v_proj.bias": {16}, a + "o_proj.weight": {32, 32}, a + "o_proj.bias": {32},
		a + "sinks": {4}, m + "router.weight": {4, 32}, m + "router.bias": {4},
	}
	for e := range 4 {
		x := m + "experts."
		s := "[" + string(rune('0'+e)) + "]"
		want[x+"gate_up_proj"+s] = []int{32, 32}
		want[x+"gate_up_proj_bias"+s] = []int{32}
		want[x+"down_proj"+s] = []int{16, 32}
		want[x+"down_proj_bias"+s] = []int{32}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("layer 0 tensors:\n got %v\nwant %v", got, want)
	}
}

// TestGPTOSSStackedCheckpoint: a GPT-OSS checkpoint holds each layer's
// experts as the stacks GptOssExperts declares (gate_up_proj [E, D, 2F],
// gate_up_proj_bias [E, 2F], down_proj [E, F, D], down_proj_bias [E, D];
// modeling_gpt_oss.py, transformers 00d4b3d2), expert e's slice at offset
// e × its size; SaveParams writes them so and LoadParams reads back every
// parameter unchanged.
func TestGPTOSSStackedCheckpoint(t *testing.T) {
	c, err := ParseConfig([]byte(smallGPTOSS), "small")
	if err != nil {
		t.Fatal(err)
	}
	ps := c.Params()
	data := make([][]float32, len(ps))
	next := float32(0)
	for i, p := range ps {
		data[i] = make([]float32, p.Elements())
		for j := range data[i] {
			data[i][j], next = next, next+1
		}
	}
	path := t.TempDir() + "/w.safetensors"
	if err := SaveParams(path, c, data, moe.F32, false); err != nil {
		t.Fatal(err)
	}
	ck, err := OpenCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	const x = "model.layers.1.mlp.experts."
	D, F, E := 32, 16, 4
	for _, s := range []struct {
		name  string
		shape []int
	}{{"gate_up_proj", []int{E, D, 2 * F}}, {"gate_up_proj_bias", []int{E, 2 * F}}, {"down_proj", []int{E, F, D}}, {"down_proj_bias", []int{E, D}}} {
		info, ok := ck.Info(x + s.name)
		if !ok || !reflect.DeepEqual(info.Shape, s.shape) {
			t.Fatalf("%s: %v %v, want shape %v", s.name, ok, info.Shape, s.shape)
		}
		v, err := ck.ReadFloat32(x + s.name)
		if err != nil {
			t.Fatal(err)
		}
		per := len(v) / E
		for e := 0; e < E; e++ {
			slice := tensorOf(t, ps, data, fmt.Sprintf("%s%s[%d]", x, s.name, e))
			if !reflect.DeepEqual(v[e*per:(e+1)*per], slice) {
				t.Errorf("%s: expert %d's slice is not at offset %d", s.name, e, e*per)
			}
		}
	}
	got, err := LoadParams[float32](path, c)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, data) {
		t.Error("LoadParams does not give back what SaveParams wrote")
	}
}

// tensorOf returns data's tensor of the parameter named name.
func tensorOf(t *testing.T, ps []moe.Param, data [][]float32, name string) []float32 {
	for i, p := range ps {
		if p.Name == name {
			return data[i]
		}
	}
	t.Fatalf("no parameter %s", name)
	return nil
}
