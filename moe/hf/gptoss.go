package hf

import (
	"fmt"

	"github.com/moescope/moescope/moe"
)

// GPT-OSS configs (model_type gpt_oss), read as transformers' GptOssConfig
// (configuration_gpt_oss.py, transformers 02b8f42b) and run as
// modeling_gpt_oss.py at transformers 00d4b3d2 computes: every layer MoE
// with fused, biased experts under the clamped SwiGLU; a biased router
// whose top-k logits are softmaxed; q, k, v and o biases (attention_bias,
// default true); per-head attention sinks; layers alternating between a
// sliding window (even layers) and full attention; YaRN RoPE.

// gptOSSDefaultYarn is GptOssConfig's rope_parameters when the file gives
// neither rope_parameters nor rope_scaling (configuration_gpt_oss.py,
// transformers 02b8f42b, __post_init__); the released checkpoints' own
// config.json spells the same values under rope_scaling.
func gptOSSDefaultYarn(maxPos *int, e *hfErrors) *moe.Yarn {
	factor, fast, slow, orig, trunc := 32.0, 32.0, 1.0, 4096, false
	r := &hfRope{RopeType: "yarn", Factor: &factor, BetaFast: &fast, BetaSlow: &slow, OriginalMaxPos: &orig, Truncate: &trunc}
	return r.yarn("rope_parameters", maxPos, e)
}

// gptOSSAttention fills attention for gpt_oss: attention_bias puts biases
// on all four projections; every layer has sinks.
func (h *configJSON) gptOSSAttention(c *moe.Config, e *hfErrors) {
	h.attention(c, hfDefaults["gpt_oss"], e)
	bias := opt(h.AttentionBias, true)
	c.QKVBias, c.OProjBias, c.AttnSinks = bias, bias, true
	if h.RopeScaling == nil && h.RopeParameters == nil {
		c.RopeScaling, c.Yarn = "yarn", gptOSSDefaultYarn(h.MaxPositions, e)
	}
}

// moeGPTOSS fills GPT-OSS's experts and routing; every layer is MoE.
func (h *configJSON) moeGPTOSS(c *moe.Config, e *hfErrors) func(int) bool {
	// GptOssTopKRouter: logits = x·Wᵀ + b, top-k of the logits, softmax
	// over those k: the renormalized top-k of softmax(logits), with no ε.
	c.Experts = e.req("num_local_experts", h.NumLocalExperts)
	c.ExpertFFN = e.req("intermediate_size", h.IntermediateSize)
	c.NormTopK, c.NormTopKEps = true, 0
	c.RouterBias, c.ExpertBias, c.FusedExperts = true, true, true
	c.Clamp = &moe.SwiGLUClamp{Alpha: opt(h.SwigluAlpha, 1.702), Limit: opt(h.SwigluLimit, 7.0)}
	c.Names = moe.TensorNames{Router: "router"}
	return func(int) bool { return true }
}

// gptOSSWindows fills the windows as GptOssConfig does: sliding_window
// defaults to 128 (an explicit null leaves none); layer_types, when
// absent, puts sliding attention on even layers ((i+1) % 2 == 1) and full
// attention on odd ones.
func (h *configJSON) gptOSSWindows(c *moe.Config) error {
	w := 128
	if h.slidingWindowSet {
		w = opt(h.SlidingWindow, 0)
		if h.SlidingWindow != nil && w <= 0 {
			return fmt.Errorf("sliding_window = %d: must be ≥ 1 or null", w)
		}
	}
	if h.LayerTypes != nil {
		return h.layerTypes(c, w)
	}
	if w == 0 {
		return fmt.Errorf("sliding_window is null but layer_types is absent (GptOssConfig then makes even layers sliding_attention)")
	}
	for i := range c.Window {
		if i%2 == 0 {
			c.Window[i] = w
		}
	}
	return nil
}
