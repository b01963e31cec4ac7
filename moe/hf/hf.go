package hf

import (
	"errors"
	"fmt"
	"math"
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

	slidingWindowSet bool // "sliding_window" present, even as null
	qLoraRankSet     bool // "q_lora_rank" present, even as null (no query latent)
}

// hfRope is rope_parameters or rope_scaling; older configs name the type
// "type" instead of "rope_type".
type hfRope struct {
	RopeTheta    *float64 `json:"rope_theta"`
	RopeType     string   `json:"rope_type"`
	Type         string   `json:"type"`
	Factor       *float64 `json:"factor"`         // yarn
	MScaleAllDim *float64 `json:"mscale_all_dim"` // yarn, DeepSeek's softmax-scale correction
	// yarn's frequency blend and cos/sin factor (moe.Yarn)
	MScale          *float64 `json:"mscale"`
	AttentionFactor *float64 `json:"attention_factor"`
	BetaFast        *float64 `json:"beta_fast"`
	BetaSlow        *float64 `json:"beta_slow"`
	OriginalMaxPos  *int     `json:"original_max_position_embeddings"`
	Truncate        *bool    `json:"truncate"`
}

// scaling returns the rope type when it rescales frequencies, else "".
func (r *hfRope) scaling() string {
	if r == nil {
		return ""
	}
	t := r.RopeType
	if t == "" {
		t = r.Type
	}
	if t == "default" {
		return ""
	}
	return t
}

// ParseConfig reads a Hugging Face config.json into a validated Config. name is
// recorded as Config.Name and used in errors.
func ParseConfig(data []byte, name string) (*moe.Config, error) {
	h, err := decodeHF(data)
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
	if def.mla != nil {
		h.mla(c, def, &e)
	} else {
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

// rope fills RoPE's base, scaling type and rotated fraction, and YaRN's
// parameters.
func (h *configJSON) rope(c *moe.Config, def hfDefault, e *hfErrors) {
	c.RotaryFraction = opt(h.PartialRotaryFactor, def.rotary)
	c.RopeTheta = def.ropeTheta
	if h.RopeParameters != nil && h.RopeParameters.RopeTheta != nil {
		c.RopeTheta = *h.RopeParameters.RopeTheta
	}
	if h.RopeTheta != nil {
		c.RopeTheta = *h.RopeTheta
	}
	r, key := h.RopeScaling, "rope_scaling"
	c.RopeScaling = h.RopeScaling.scaling()
	if t := h.RopeParameters.scaling(); t != "" {
		r, key, c.RopeScaling = h.RopeParameters, "rope_parameters", t
	}
	if c.RopeScaling == "yarn" {
		c.Yarn = r.yarn(key, h.MaxPositions, e)
	}
}

// yarn reads YaRN's keys as _compute_yarn_parameters does (transformers
// 26892c16, see moe.Yarn): factor is required; beta_fast and beta_slow
// default to 32 and 1 (also when 0: the code reads them with `or`);
// original_max_position_embeddings defaults to max_position_embeddings;
// truncate to true; attention_factor, when absent, is
// m(factor, mscale)/m(factor, mscale_all_dim) when both are non-zero, else
// m(factor, 1), with m(s, k) = 0.1·k·ln s + 1 for s > 1 and 1 otherwise.
// Transformers 89539b06 instead replaced factor by max_position_embeddings ÷
// original_max_position_embeddings whenever the latter is given; the two
// agree on every built-in (DeepSeek-V3 163840/4096 = 40, Kimi-K2
// 131072/4096 = 32, DeepSeek-V2-Lite 40).
func (r *hfRope) yarn(key string, maxPos *int, e *hfErrors) *moe.Yarn {
	if r.Factor == nil {
		*e = append(*e, fmt.Errorf("%s.factor: required key is missing (rope_type yarn)", key))
		return nil
	}
	y := &moe.Yarn{Factor: *r.Factor, BetaFast: 32, BetaSlow: 1, Truncate: opt(r.Truncate, true)}
	if r.BetaFast != nil && *r.BetaFast != 0 {
		y.BetaFast = *r.BetaFast
	}
	if r.BetaSlow != nil && *r.BetaSlow != 0 {
		y.BetaSlow = *r.BetaSlow
	}
	switch {
	case r.OriginalMaxPos != nil:
		y.OriginalMaxPositions = *r.OriginalMaxPos
	case maxPos != nil:
		y.OriginalMaxPositions = *maxPos
	default:
		*e = append(*e, fmt.Errorf("%s.original_max_position_embeddings: required key is missing (rope_type yarn; nor is max_position_embeddings given)", key))
	}
	m := func(s, k float64) float64 {
		if s <= 1 {
			return 1
		}
		return 0.1*k*math.Log(s) + 1
	}
	switch {
	case r.AttentionFactor != nil:
		y.AttentionFactor = *r.AttentionFactor
	case r.MScale != nil && *r.MScale != 0 && r.MScaleAllDim != nil && *r.MScaleAllDim != 0:
		y.AttentionFactor = m(y.Factor, *r.MScale) / m(y.Factor, *r.MScaleAllDim)
	default:
		y.AttentionFactor = m(y.Factor, 1)
	}
	return y
}

// attention fills KV heads, head dim, projection biases and QK-norm.
func (h *configJSON) attention(c *moe.Config, def hfDefault, e *hfErrors) {
	c.KVHeads = opt(h.NumKeyValueHeads, c.Heads)
	switch {
	case h.HeadDim != nil:
		c.HeadDim = *h.HeadDim
	case c.Heads > 0:
		c.HeadDim = c.Hidden / c.Heads
	}
	c.QKNorm, c.QKVBias = def.qkNorm, def.qkvBias
	if h.ClipQKV != nil {
		e.unsupported("clip_qkv", *h.ClipQKV, "QKV clipping is not modelled")
	}
	if bias := opt(h.AttentionBias, false); bias {
		switch {
		case def.oProjHasBias:
			e.unsupported("attention_bias", true, h.ModelType+" then also puts a bias on o_proj, which is not modelled")
		case h.ModelType == "glm4_moe":
			c.QKVBias = true // q, k, v biases; o_proj has none
		}
		// mixtral and qwen2_moe do not read attention_bias.
	}
	if h.ModelType == "qwen2_moe" && h.QKVBias != nil {
		c.QKVBias = *h.QKVBias
	}
	if h.ModelType == "glm4_moe" && opt(h.UseQKNorm, false) {
		c.QKNorm = moe.QKNormHead
	}
}

// denseFFN fills the dense layers' FFN width: every type but mixtral and
// olmoe (whose intermediate_size is the expert width) reads
// intermediate_size.
func (h *configJSON) denseFFN(c *moe.Config, e *hfErrors) {
	switch h.ModelType {
	case "mixtral", "olmoe":
	default:
		c.DenseFFN = e.req("intermediate_size", h.IntermediateSize)
	}
}

// experts fills experts, routing, the aux loss and the MoE/dense layer pattern.
func (h *configJSON) experts(c *moe.Config, def hfDefault, layersOK bool, e *hfErrors) {
	c.NormTopK = opt(h.NormTopKProb, def.normTopK)
	c.AuxLossCoef = opt(h.RouterAuxLossCoef, def.auxCoef)
	c.OutputRouterLogits = opt(h.OutputRouterLogits, false)
	c.TopK = e.req("num_experts_per_tok", h.NumExpertsPerTok)
	isMoE := func(int) bool { return true }
	switch h.ModelType {
	case "qwen3_moe", "qwen2_moe":
		isMoE = h.moeQwen(c, layersOK, e)
	case "mixtral":
		c.Experts = e.req("num_local_experts", h.NumLocalExperts)
		c.ExpertFFN = e.req("intermediate_size", h.IntermediateSize)
		c.NormTopK = true // softmax over the top-k logits is the renormalized top-k
		// MixtralDecoderLayer.block_sparse_moe holds MixtralBlockSparseTop2MLP
		// experts with w2(silu(w1(x))·w3(x)) (modeling_mixtral.py,
		// transformers commit 00d4b3d2).
		c.Names = moe.TensorNames{MoE: "block_sparse_moe", ExpertGate: "w1", ExpertUp: "w3", ExpertDown: "w2"}
	case "olmoe":
		c.Experts = e.req("num_experts", h.NumExperts)
		c.ExpertFFN = e.req("intermediate_size", h.IntermediateSize)
	case "deepseek":
		isMoE = h.moeDeepseek(c, def, e)
	case "glm4_moe":
		isMoE = h.moeGLM(c, def, e)
	case "deepseek_v3", "kimi_k2", "deepseek_v2":
		isMoE = h.moeDeepseekMLA(c, def, e)
	}
	if layersOK {
		for i := range c.MoELayer {
			c.MoELayer[i] = isMoE(i)
		}
	}
	if c.MoELayers() == c.Layers && (h.ModelType == "mixtral" || h.ModelType == "olmoe") {
		c.DenseFFN = 0
	}
}

// moeQwen fills Qwen3-MoE's and Qwen2-MoE's experts; the result says which
// layers are MoE.
func (h *configJSON) moeQwen(c *moe.Config, layersOK bool, e *hfErrors) func(int) bool {
	// Qwen*MoeDecoderLayer: MoE when the layer is not in mlp_only_layers
	// and num_experts > 0 and (i+1) % decoder_sparse_step == 0.
	c.Experts = e.req("num_experts", h.NumExperts)
	c.ExpertFFN = e.req("moe_intermediate_size", h.MoEIntermediateSize)
	step := opt(h.DecoderSparseStep, 1)
	if step <= 0 {
		e.unsupported("decoder_sparse_step", step, "must be ≥ 1")
		step = 1
	}
	dense := map[int]bool{}
	for _, i := range h.MLPOnlyLayers {
		if i < 0 || (layersOK && i >= c.Layers) {
			e.unsupported("mlp_only_layers", i, fmt.Sprintf("layer index must be in [0, %d)", c.Layers))
		}
		dense[i] = true
	}
	if h.ModelType == "qwen2_moe" {
		// One shared expert of shared_expert_intermediate_size, scaled by
		// σ(x·w_g) (Qwen2MoeSparseMoeBlock.shared_expert_gate).
		if s := e.req("shared_expert_intermediate_size", h.SharedIntermediate); s > 0 {
			c.SharedExperts, c.SharedFFN, c.SharedGated = 1, s, true
		}
		// Qwen2MoeSparseMoeBlock.shared_expert (singular; modeling_qwen2_moe.py,
		// transformers commit 1c351314).
		c.Names.Shared = "shared_expert"
	}
	return func(i int) bool { return !dense[i] && c.Experts > 0 && (i+1)%step == 0 }
}

// moeDeepseek fills DeepSeek-MoE's experts, routing and aux loss; the
// result says which layers are MoE.
func (h *configJSON) moeDeepseek(c *moe.Config, def hfDefault, e *hfErrors) func(int) bool {
	// modeling_deepseek.py: DeepseekMoE when n_routed_experts is set and
	// i ≥ first_k_dense_replace and i % moe_layer_freq == 0; shared
	// experts are one DeepseekMLP of moe_intermediate_size·n_shared_experts.
	// Its MoEGate renormalizes the top-k weights only when top_k > 1,
	// adding 1e-20 to their sum, and adds aux_loss_alpha·aux whenever
	// training, per sequence when seq_aux (the default).
	c.Experts = e.req("n_routed_experts", h.NRoutedExperts)
	c.ExpertFFN = e.req("moe_intermediate_size", h.MoEIntermediateSize)
	if s := opt(h.NSharedExperts, 0); s > 0 {
		c.SharedExperts, c.SharedFFN = s, c.ExpertFFN
	}
	if sf := h.ScoringFunc; sf != nil && *sf != "softmax" {
		e.unsupported("scoring_func", *sf, `DeepSeek-MoE's MoEGate implements only "softmax"`)
	}
	c.NormTopK = c.NormTopK && c.TopK > 1
	c.NormTopKEps = 1e-20
	c.AuxLossCoef = opt(h.AuxLossAlpha, def.auxCoef)
	c.OutputRouterLogits = c.AuxLossCoef > 0
	c.SeqAuxLoss = true
	if !opt(h.SeqAux, true) && c.AuxLossCoef > 0 {
		e.unsupported("seq_aux", false, "MoEGate's batch-level aux loss is not modelled; with aux_loss_alpha > 0 only seq_aux = true is")
	}
	first := opt(h.FirstKDenseReplace, def.firstKDense)
	freq := opt(h.MoELayerFreq, 1)
	if freq <= 0 {
		e.unsupported("moe_layer_freq", freq, "must be ≥ 1")
		freq = 1
	}
	return func(i int) bool { return i >= first && i%freq == 0 }
}

// moeGLM fills GLM-4.5's experts and routing; the result says which layers
// are MoE.
func (h *configJSON) moeGLM(c *moe.Config, def hfDefault, e *hfErrors) func(int) bool {
	// Glm4MoeDecoderLayer: MoE from first_k_dense_replace on; a sigmoid
	// Glm4MoeTopkRouter with e_score_correction_bias, grouped top-k and
	// routed_scaling_factor; shared experts as one MLP of
	// moe_intermediate_size·n_shared_experts.
	c.Experts = e.req("n_routed_experts", h.NRoutedExperts)
	c.ExpertFFN = e.req("moe_intermediate_size", h.MoEIntermediateSize)
	if s := opt(h.NSharedExperts, 1); s > 0 {
		c.SharedExperts, c.SharedFFN = s, c.ExpertFFN
	}
	c.Score, c.SelectionBias = moe.Sigmoid, true
	c.NormTopKEps = 1e-20      // Glm4MoeMoE.route_tokens_to_experts
	c.IgnoreExtraLayers = true // the MTP block (skippedByHF in weights.go)
	c.RoutedScale = opt(h.RoutedScalingFactor, 1)
	c.Groups = opt(h.NGroup, 1)
	c.TopKGroups = opt(h.TopKGroup, 1)
	c.AuxLossCoef = opt(h.RouterAuxLossCoef, 0)
	first := opt(h.FirstKDenseReplace, def.firstKDense)
	return func(i int) bool { return i >= first }
}

// windows fills the per-layer attention window: layer_types when given
// (transformers ≥ 4.53), else Qwen's use_sliding_window with layers from
// max_window_layers on sliding, else Mixtral's sliding_window on every layer.
func (h *configJSON) windows(c *moe.Config) error {
	w := 0
	if h.SlidingWindow != nil {
		w = *h.SlidingWindow
		if w <= 0 {
			return fmt.Errorf("sliding_window = %d: must be ≥ 1 or null", w)
		}
	}
	if h.LayerTypes != nil {
		if len(h.LayerTypes) != c.Layers {
			return fmt.Errorf("layer_types has %d entries: needs one per layer (%d)", len(h.LayerTypes), c.Layers)
		}
		for i, t := range h.LayerTypes {
			switch t {
			case "full_attention":
			case "sliding_attention":
				if w == 0 {
					return fmt.Errorf("layer_types[%d] = %q but sliding_window is null", i, t)
				}
				c.Window[i] = w
			default:
				return fmt.Errorf("layer_types[%d] = %q: not supported (full_attention or sliding_attention)", i, t)
			}
		}
		return nil
	}
	switch h.ModelType {
	case "mixtral":
		for i := range c.Window {
			c.Window[i] = w
		}
	case "qwen3_moe", "qwen2_moe", "qwen3":
		// The Qwen config classes default sliding_window to 4096 (an
		// explicit null disables it) and max_window_layers to 28.
		if !h.slidingWindowSet {
			w = 4096
		}
		if w == 0 || h.UseSlidingWindow == nil || !*h.UseSlidingWindow {
			return nil
		}
		first := 28
		if h.MaxWindowLayers != nil {
			first = *h.MaxWindowLayers
		}
		for i := range c.Window {
			if i >= first {
				c.Window[i] = w
			}
		}
	}
	return nil
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
