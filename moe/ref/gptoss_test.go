package ref

import "github.com/moescope/moescope/moe"

// gptOSSVariant turns base into a GPT-OSS-style variant for tinyVariants:
// sinks, biases on q, k, v, o, the router and the fused experts, the
// clamped SwiGLU with a limit small enough (0.3) that its clamps bite on
// these weights, a sliding (2) and a full layer, YaRN RoPE.
func gptOSSVariant(c *moe.Config) *moe.Config {
	c.ModelType = "gpt_oss"
	c.QKNorm, c.QKVBias, c.OProjBias, c.AttnSinks = moe.QKNormNone, true, true, true
	c.RouterBias, c.ExpertBias, c.FusedExperts = true, true, true
	c.Clamp = &moe.SwiGLUClamp{Alpha: 1.702, Limit: 0.3}
	c.NormTopKEps = 0
	c.Window = []int{2, 0}
	c.Names = moe.TensorNames{Router: "router"}
	c.RopeScaling = "yarn"
	c.Yarn = &moe.Yarn{Factor: 4, OriginalMaxPositions: 4, BetaFast: 32, BetaSlow: 1, AttentionFactor: 1.1}
	return c
}
