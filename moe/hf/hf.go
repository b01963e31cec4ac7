package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe"
)

// Reading Hugging Face config.json files.
//
// ParseConfig normalizes a config.json into a Config following the modeling code
// of each supported model_type (transformers' Qwen3Moe, Qwen2Moe, Mixtral,
// OLMoE, Glm4Moe, Qwen3, Llama, DeepseekV3 (also for kimi_k2) and DeepseekV2,
// deepseek.go; DeepSeek-MoE's remote-code modeling_deepseek.py). Keys the
// model code does not read are ignored, as
// transformers ignores them; "_source" is moescope's own key naming where the
// numbers come from. Absent keys take the default of that model type's
// transformers config class, except the sizes that define the architecture
// (vocabulary, hidden, layers, heads, FFN widths, experts), which are
// required.
//
// This file holds the keys, the defaults, ParseConfig and Load; normalize
// hands each concern to its own file: rope.go, attention.go, experts.go and,
// for latent attention, deepseek.go.

// SupportedModelTypes lists the HF model_type values ParseConfig reads.
func SupportedModelTypes() []string {
	ts := make([]string, 0, len(hfDefaults))
	for t := range hfDefaults {
		ts = append(ts, t)
	}
	sort.Strings(ts)
	return ts
}

// hfDefault holds a model type's config-class defaults for optional keys.
type hfDefault struct {
	normEps      float64
	ropeTheta    float64
	normTopK     bool
	auxCoef      float64
	rotary       float64
	qkNorm       moe.QKNorm
	moe          bool // has routed experts
	firstKDense  int  // default first_k_dense_replace
	qkvBias      bool // q, k, v biases are unconditional (Qwen2-MoE)
	oProjHasBias bool // attention_bias also adds an o_proj bias (unsupported)
	mla          *mlaDefault
	llama4       bool // Llama 4's attention, routing and layer pattern (llama4.go)
}

// Defaults from each transformers configuration class and, for
// deepseek, DeepSeek-MoE's configuration_deepseek.py.
var hfDefaults = map[string]hfDefault{
	"qwen3_moe": {normEps: 1e-6, ropeTheta: 10000, auxCoef: 0.001, rotary: 1, qkNorm: moe.QKNormHead, moe: true, oProjHasBias: true},
	"qwen2_moe": {normEps: 1e-6, ropeTheta: 10000, auxCoef: 0.001, rotary: 1, qkNorm: moe.QKNormNone, moe: true, qkvBias: true},
	"mixtral":   {normEps: 1e-5, ropeTheta: 1e6, normTopK: true, auxCoef: 0.001, rotary: 1, qkNorm: moe.QKNormNone, moe: true},
	"olmoe":     {normEps: 1e-5, ropeTheta: 10000, auxCoef: 0.01, rotary: 1, qkNorm: moe.QKNormFull, moe: true, oProjHasBias: true},
	"deepseek":  {normEps: 1e-6, ropeTheta: 10000, auxCoef: 0.001, rotary: 1, qkNorm: moe.QKNormNone, moe: true, oProjHasBias: true},
	"glm4_moe":  {normEps: 1e-5, ropeTheta: 10000, normTopK: true, rotary: 0.5, qkNorm: moe.QKNormNone, moe: true, firstKDense: 1},
	"qwen3":     {normEps: 1e-6, ropeTheta: 10000, rotary: 1, qkNorm: moe.QKNormHead, oProjHasBias: true},
	"llama":     {normEps: 1e-6, ropeTheta: 10000, rotary: 1, qkNorm: moe.QKNormNone, oProjHasBias: true},
	// transformers' DeepseekV3Config (configuration_deepseek_v3.py,
	// transformers 001f85b3) and DeepseekV2Config
	// (configuration_deepseek_v2.py, transformers 008e5743); kimi_k2 configs
	// name DeepseekV3Config and DeepseekV3ForCausalLM (remote code).
	"deepseek_v3": {normEps: 1e-6, ropeTheta: 10000, normTopK: true, rotary: 1, qkNorm: moe.QKNormNone, moe: true, firstKDense: 3, mla: deepseekV3MLA},
	"kimi_k2":     {normEps: 1e-6, ropeTheta: 10000, normTopK: true, rotary: 1, qkNorm: moe.QKNormNone, moe: true, firstKDense: 3, mla: deepseekV3MLA},
	"deepseek_v2": {normEps: 1e-6, ropeTheta: 10000, rotary: 1, qkNorm: moe.QKNormNone, moe: true, mla: deepseekV2MLA},
	// transformers' GptOssConfig (configuration_gpt_oss.py, transformers
	// 02b8f42b; gptoss.go).
	"gpt_oss": {normEps: 1e-5, ropeTheta: 150000, auxCoef: 0.001, rotary: 1, qkNorm: moe.QKNormNone, moe: true},
	// transformers' Llama4TextConfig (configuration_llama4.py, transformers
	// 008e5743; llama4.go); llama4 reads its text_config.
	"llama4":      llama4Default,
	"llama4_text": llama4Default,
}

// configJSON is the union of the config.json keys moescope reads. Pointers
// distinguish an absent key from a zero value.
type configJSON struct {
	Source    string `json:"_source"`
	ModelType string `json:"model_type"`

	VocabSize         *int    `json:"vocab_size"`
	HiddenSize        *int    `json:"hidden_size"`
	IntermediateSize  *int    `json:"intermediate_size"`
	NumHiddenLayers   *int    `json:"num_hidden_layers"`
	NumAttentionHeads *int    `json:"num_attention_heads"`
	NumKeyValueHeads  *int    `json:"num_key_value_heads"`
	HeadDim           *int    `json:"head_dim"`
	HiddenAct         *string `json:"hidden_act"`

	NumExperts          *int  `json:"num_experts"`       // qwen3_moe, qwen2_moe, olmoe
	NumLocalExperts     *int  `json:"num_local_experts"` // mixtral
	NRoutedExperts      *int  `json:"n_routed_experts"`  // deepseek, glm4_moe
	NumExpertsPerTok    *int  `json:"num_experts_per_tok"`
	MoEIntermediateSize *int  `json:"moe_intermediate_size"`
	SharedIntermediate  *int  `json:"shared_expert_intermediate_size"` // qwen2_moe
	NSharedExperts      *int  `json:"n_shared_experts"`                // deepseek, glm4_moe
	DecoderSparseStep   *int  `json:"decoder_sparse_step"`
	MLPOnlyLayers       []int `json:"mlp_only_layers"`
	FirstKDenseReplace  *int  `json:"first_k_dense_replace"`
	MoELayerFreq        *int  `json:"moe_layer_freq"`

	NormTopKProb        *bool    `json:"norm_topk_prob"`
	ScoringFunc         *string  `json:"scoring_func"`
	TopKMethod          *string  `json:"topk_method"`
	RoutedScalingFactor *float64 `json:"routed_scaling_factor"`
	NGroup              *int     `json:"n_group"`
	TopKGroup           *int     `json:"topk_group"`

	AttentionBias       *bool    `json:"attention_bias"`
	QKVBias             *bool    `json:"qkv_bias"`
	MLPBias             *bool    `json:"mlp_bias"`
	UseQKNorm           *bool    `json:"use_qk_norm"`
	ClipQKV             *float64 `json:"clip_qkv"`
	PartialRotaryFactor *float64 `json:"partial_rotary_factor"`
	RopeTheta           *float64 `json:"rope_theta"`
	RopeParameters      *hfRope  `json:"rope_parameters"` // transformers ≥ 5
	RopeScaling         *hfRope  `json:"rope_scaling"`
	MaxPositions        *int     `json:"max_position_embeddings"`
	RMSNormEps          *float64 `json:"rms_norm_eps"`
	TieWordEmbeddings   *bool    `json:"tie_word_embeddings"`

	SlidingWindow    *int     `json:"sliding_window"`
	UseSlidingWindow *bool    `json:"use_sliding_window"`
	MaxWindowLayers  *int     `json:"max_window_layers"`
	LayerTypes       []string `json:"layer_types"`

	RouterAuxLossCoef  *float64 `json:"router_aux_loss_coef"`
	AuxLossAlpha       *float64 `json:"aux_loss_alpha"`
	SeqAux             *bool    `json:"seq_aux"` // deepseek
	OutputRouterLogits *bool    `json:"output_router_logits"`
	InitializerRange   *float64 `json:"initializer_range"`

	// Multi-head latent attention (deepseek_v2, deepseek_v3, kimi_k2).
	QLoraRank            *int  `json:"q_lora_rank"`
	KVLoraRank           *int  `json:"kv_lora_rank"`
	QKNopeHeadDim        *int  `json:"qk_nope_head_dim"`
	QKRopeHeadDim        *int  `json:"qk_rope_head_dim"`
	VHeadDim             *int  `json:"v_head_dim"`
	RopeInterleave       *bool `json:"rope_interleave"`
	NumNextnPredictLayer *int  `json:"num_nextn_predict_layers"`

	// GPT-OSS's clamped SwiGLU (gptoss.go).
	SwigluAlpha *float64 `json:"swiglu_alpha"`
	SwigluLimit *float64 `json:"swiglu_limit"`

	// Llama 4 (llama4.go).
	TextConfig          json.RawMessage `json:"text_config"`
	IntermediateSizeMLP *int            `json:"intermediate_size_mlp"`
	MoELayers           []int           `json:"moe_layers"`
	InterleaveMoEStep   *int            `json:"interleave_moe_layer_step"`
	NoRopeLayers        []int           `json:"no_rope_layers"`
	NoRopeLayerInterval *int            `json:"no_rope_layer_interval"`
	AttentionChunkSize  *int            `json:"attention_chunk_size"`
	AttnTemperatureTune json.RawMessage `json:"attn_temperature_tuning"`
	FloorScale          *float64        `json:"floor_scale"`
	AttnScale           *float64        `json:"attn_scale"`

	slidingWindowSet bool // "sliding_window" present, even as null
	qLoraRankSet     bool // "q_lora_rank" present, even as null (no query latent)
	attnChunkSet     bool // "attention_chunk_size" present, even as null
}

// ParseConfig reads a Hugging Face config.json into a validated Config. name is
// recorded as Config.Name and used in errors.
func ParseConfig(data []byte, name string) (*moe.Config, error) {
	h, err := decodeHF(data)
	if err == nil && h.ModelType == "llama4" {
		h, err = h.llama4TextConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	neg := h.negativeInts()
	c, err := h.normalize()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, errors.Join(neg, err))
	}
	c.Name = name
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: invalid config:\n%w", name, errors.Join(neg, err))
	}
	if neg != nil {
		return nil, fmt.Errorf("%s: %w", name, neg)
	}
	return c, nil
}

// hfErrors collects every problem of one config.json, reported together in
// the order found.
type hfErrors []error

// req returns a required integer key, recording it as missing when absent.
func (e *hfErrors) req(key string, p *int) int {
	if p == nil {
		*e = append(*e, fmt.Errorf("%s: required key is missing", key))
		return 0
	}
	return *p
}

// unsupported records a key whose value the reference does not model.
func (e *hfErrors) unsupported(key string, v any, why string) {
	*e = append(*e, fmt.Errorf("%s = %v: not supported (%s)", key, v, why))
}

// opt returns an optional key's value, or the default d when it is absent.
func opt[V any](p *V, d V) V {
	if p == nil {
		return d
	}
	return *p
}

// normalize maps HF keys onto Config following the model type's modeling
// code: sizes and norms here, then each concern in its own function.
func (h *configJSON) normalize() (*moe.Config, error) {
	def, ok := hfDefaults[h.ModelType]
	if !ok {
		if h.ModelType == "" {
			return nil, fmt.Errorf("model_type is missing (supported: %s)", strings.Join(SupportedModelTypes(), ", "))
		}
		return nil, fmt.Errorf("model_type = %q is not supported (supported: %s)", h.ModelType, strings.Join(SupportedModelTypes(), ", "))
	}
	var e hfErrors
	c := &moe.Config{
		ModelType: h.ModelType,
		Source:    h.Source,
		Vocab:     e.req("vocab_size", h.VocabSize),
		Hidden:    e.req("hidden_size", h.HiddenSize),
		Layers:    e.req("num_hidden_layers", h.NumHiddenLayers),
		Heads:     e.req("num_attention_heads", h.NumAttentionHeads),
		Score:     moe.Softmax, RoutedScale: 1, Groups: 1, TopKGroups: 1,
		NormEps:        opt(h.RMSNormEps, def.normEps),
		TiedEmbeddings: opt(h.TieWordEmbeddings, false),
		InitRange:      opt(h.InitializerRange, 0.02),
	}
	h.rope(c, def, &e)
	if h.HiddenAct != nil && *h.HiddenAct != "silu" {
		e.unsupported("hidden_act", *h.HiddenAct, `only "silu" (SwiGLU) is modelled`)
	}
	if h.MLPBias != nil && *h.MLPBias {
		e.unsupported("mlp_bias", true, "FFN biases are not modelled")
	}
	switch {
	case def.mla != nil:
		h.mla(c, def, &e)
	case h.ModelType == "gpt_oss":
		h.gptOSSAttention(c, &e)
	case def.llama4:
		h.llama4Attention(c, def, &e)
	default:
		h.attention(c, def, &e)
	}

	layersOK := c.Layers > 0 && c.Layers <= moe.MaxDim
	if layersOK {
		c.MoELayer = make([]bool, c.Layers)
		c.Window = make([]int, c.Layers)
	}
	h.denseFFN(c, &e)
	if def.moe {
		h.experts(c, def, layersOK, &e)
	}
	if layersOK {
		if err := h.windows(c); err != nil {
			e = append(e, err)
		}
	}
	return c, errors.Join(e...)
}

// negativeInts refuses every integer key below 0, naming it. Each integer
// key is a size, a count, a layer index or a step, so none may be negative;
// a negative num_experts once made a qwen3_moe config silently dense (its
// layers are MoE only when num_experts > 0).
func (h *configJSON) negativeInts() error {
	var errs []error
	v := reflect.ValueOf(h).Elem()
	t := v.Type()
	for i := range t.NumField() {
		key, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		switch f := v.Field(i); {
		case f.Type() == reflect.TypeFor[*int]() && !f.IsNil() && f.Elem().Int() < 0:
			errs = append(errs, fmt.Errorf("%s = %d: must be ≥ 0 (a size, count or index)", key, f.Elem().Int()))
		case f.Type() == reflect.TypeFor[[]int]():
			for j := range f.Len() {
				if n := f.Index(j).Int(); n < 0 {
					errs = append(errs, fmt.Errorf("%s[%d] = %d: must be ≥ 0 (a layer index)", key, j, n))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Load returns a built-in model by name (see Builtins) or reads a
// config.json from a path. An unknown name that is no readable file is an
// error listing the built-ins.
func Load(nameOrPath string) (*moe.Config, error) {
	if data, ok := builtinJSON(nameOrPath); ok {
		return ParseConfig(data, nameOrPath)
	}
	data, err := readConfigFile(nameOrPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("model %q is neither a built-in (%s) nor an existing config.json file", nameOrPath, strings.Join(Builtins(), ", "))
		}
		return nil, fmt.Errorf("model %q: %w", nameOrPath, err)
	}
	return ParseConfig(data, nameOrPath)
}

// maxConfigBytes bounds a config.json read from disk: real ones are a few
// KiB; a device or pipe (/dev/zero) must not be read forever.
const maxConfigBytes = 1 << 20

func readConfigFile(path string) ([]byte, error) {
	data, err := fileio.ReadBounded(path, maxConfigBytes)
	var big *fileio.TooLargeError
	if errors.As(err, &big) {
		return nil, fmt.Errorf("larger than %d bytes: not a config.json", maxConfigBytes)
	}
	return data, err
}
