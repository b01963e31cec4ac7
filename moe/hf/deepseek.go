package hf

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/moe"
)

// DeepSeek-V2/V3-family configs: multi-head latent attention and
// fine-grained experts with shared ones. The modeling code followed is
// transformers' DeepseekV3 (modeling_deepseek_v3.py, transformers 00b676f8;
// kimi_k2 configs name the same classes) and DeepseekV2
// (modeling_deepseek_v2.py, transformers 0233e509). Keys the checkpoints'
// own config.json files carry for DeepSeek's remote code and transformers'
// config classes lack (scoring_func, topk_method, moe_layer_freq,
// num_nextn_predict_layers) are read too, and refused where they ask for
// something that code does not do.

// mlaDefault holds a model type's config-class defaults for the MLA and
// routing keys, and what its modeling code supports.
type mlaDefault struct {
	qRank, kvRank, nope, rope, v int
	shared                       int
	groups, topkGroups           int     // n_group, topk_group (None → 1 for V2)
	routedScale                  float64 // routed_scaling_factor
	score                        string  // the only scoring_func the code implements
	topkMethods                  []string
	// yarnSoftmaxScale: the softmax scale takes YaRN's mscale² (V3's
	// attention; transformers' DeepseekV2Attention does not apply it).
	yarnSoftmaxScale bool
	// ropeInterleave: the default of rope_interleave; v2 always rotates
	// adjacent pairs (its RoPE multiplies complex numbers).
	ropeInterleave bool
	v3Router       bool // sigmoid, selection bias, renormalization, scaling
}

var (
	deepseekV3MLA = &mlaDefault{qRank: 1536, kvRank: 512, nope: 128, rope: 64, v: 128, shared: 1,
		groups: 8, topkGroups: 4, routedScale: 2.5, score: "sigmoid", topkMethods: []string{"noaux_tc"},
		yarnSoftmaxScale: true, ropeInterleave: true, v3Router: true}
	deepseekV2MLA = &mlaDefault{qRank: 1536, kvRank: 512, nope: 128, rope: 64, v: 128, shared: 2,
		groups: 1, topkGroups: 1, routedScale: 1, score: "softmax", topkMethods: []string{"greedy", "group_limited_greedy"},
		ropeInterleave: true}
)

// latentNormEps is the ε of q_a_layernorm and kv_a_layernorm: both classes
// build them as DeepseekV*RMSNorm(rank) with the default eps = 1e-6.
const latentNormEps = 1e-6

// mla fills the attention of an MLA model type: heads, latent ranks, head
// dims, RoPE layout and the softmax scale.
func (h *configJSON) mla(c *moe.Config, def hfDefault, e *hfErrors) {
	d := def.mla
	c.KVHeads = opt(h.NumKeyValueHeads, c.Heads)
	c.QKNorm = moe.QKNormNone
	m := moe.MLA{
		QRank:   d.qRank,
		KVRank:  opt(h.KVLoraRank, d.kvRank),
		Nope:    opt(h.QKNopeHeadDim, d.nope),
		Rope:    opt(h.QKRopeHeadDim, d.rope),
		V:       opt(h.VHeadDim, d.v),
		NormEps: latentNormEps,
	}
	switch {
	case h.QLoraRank != nil && *h.QLoraRank == 0:
		e.unsupported("q_lora_rank", 0, "null means no query latent; a rank must be ≥ 1")
	case h.QLoraRank != nil:
		m.QRank = *h.QLoraRank
	case h.qLoraRankSet: // null: q_proj
		m.QRank = 0
	}
	if m.KVRank == 0 {
		e.unsupported("kv_lora_rank", 0, "must be ≥ 1")
	}
	c.MLA = m
	// The config classes set head_dim to qk_rope_head_dim (RoPE's width);
	// moescope's HeadDim is the q·k head dim.
	c.HeadDim = m.Nope + m.Rope
	c.RotaryFraction = 1
	c.RopeInterleave = d.ropeInterleave
	if d.v3Router {
		c.RopeInterleave = opt(h.RopeInterleave, d.ropeInterleave)
	}
	if opt(h.AttentionBias, false) {
		e.unsupported("attention_bias", true, h.ModelType+" then puts biases on q_a_proj, kv_a_proj_with_mqa and o_proj, which are not modelled")
	}
	if d.yarnSoftmaxScale {
		c.AttnScale = yarnSoftmaxScale(h.RopeScaling, h.RopeParameters, c.HeadDim)
	}
	c.MTPLayers = opt(h.NumNextnPredictLayer, 0)
	// The MTP modules' tensors are layers ≥ num_hidden_layers, which
	// DeepseekV3Model ignores on load (_keys_to_ignore_on_load_unexpected).
	c.IgnoreExtraLayers = true
}

// yarnSoftmaxScale is DeepseekV3Attention's softmax scale under YaRN:
// (1/√d_qk)·m² with m = 0.1·mscale_all_dim·ln(factor) + 1 when
// rope_scaling has a non-zero mscale_all_dim and factor > 1 (yarn_get_mscale);
// 0 (moe.Config's 1/√d_qk) otherwise.
func yarnSoftmaxScale(scaling, params *hfRope, dqk int) float64 {
	r := scaling
	if r == nil {
		r = params
	}
	if r == nil || r.Factor == nil || r.MScaleAllDim == nil || *r.MScaleAllDim == 0 || *r.Factor <= 1 {
		return 0
	}
	m := 0.1*(*r.MScaleAllDim)*math.Log(*r.Factor) + 1
	return m * m / math.Sqrt(float64(dqk))
}

// moeDeepseekMLA fills the experts and routing of deepseek_v3, kimi_k2 and
// deepseek_v2; the result says which layers are MoE.
func (h *configJSON) moeDeepseekMLA(c *moe.Config, def hfDefault, e *hfErrors) func(int) bool {
	d := def.mla
	c.Experts = e.req("n_routed_experts", h.NRoutedExperts)
	c.ExpertFFN = e.req("moe_intermediate_size", h.MoEIntermediateSize)
	// One MLP of moe_intermediate_size·n_shared_experts (DeepseekV*MoE).
	if s := opt(h.NSharedExperts, d.shared); s > 0 {
		c.SharedExperts, c.SharedFFN = s, c.ExpertFFN
	}
	if sf := opt(h.ScoringFunc, d.score); sf != d.score {
		e.unsupported("scoring_func", sf, fmt.Sprintf("%s's router implements only %q", h.ModelType, d.score))
	}
	method := opt(h.TopKMethod, d.topkMethods[0])
	known := false
	for _, m := range d.topkMethods {
		known = known || m == method
	}
	if !known {
		e.unsupported("topk_method", method, fmt.Sprintf("%s's router implements %q", h.ModelType, d.topkMethods))
	}
	c.RoutedScale = opt(h.RoutedScalingFactor, d.routedScale)
	// Neither modeling file adds a load-balancing loss (aux_loss_alpha is
	// read only by DeepSeek's remote code).
	c.AuxLossCoef, c.OutputRouterLogits = 0, false
	if d.v3Router {
		// DeepseekV3TopkRouter: σ scores, top-k chosen on scores +
		// e_score_correction_bias within the topk_group best of n_group
		// groups (a group scored by its two best), weights renormalized
		// with +1e-20 when norm_topk_prob, then × routed_scaling_factor.
		c.Score, c.SelectionBias = moe.Sigmoid, true
		c.NormTopKEps = 1e-20
		c.Groups = opt(h.NGroup, d.groups)
		c.TopKGroups = opt(h.TopKGroup, d.topkGroups)
	} else {
		// DeepseekV2Moe.route_tokens_to_experts: softmax scores, greedy or
		// group-limited (a group scored by its best) top-k, weights ×
		// routed_scaling_factor and never renormalized (norm_topk_prob is
		// read only by DeepSeek's remote code).
		c.Score, c.NormTopK = moe.Softmax, false
		c.Groups, c.TopKGroups = 1, 1
		if method == "group_limited_greedy" {
			c.Groups = e.req("n_group", h.NGroup)
			c.TopKGroups = e.req("topk_group", h.TopKGroup)
		}
	}
	// transformers makes layer i MoE when i ≥ first_k_dense_replace;
	// DeepSeek's remote code also needs i % moe_layer_freq == 0, which is
	// read here (every published config has moe_layer_freq = 1, where the
	// two agree).
	first := opt(h.FirstKDenseReplace, def.firstKDense)
	freq := opt(h.MoELayerFreq, 1)
	if freq <= 0 {
		e.unsupported("moe_layer_freq", freq, "must be ≥ 1")
		freq = 1
	}
	return func(i int) bool { return i >= first && i%freq == 0 }
}
