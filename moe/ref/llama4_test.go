package ref

import "github.com/moescope/moescope/moe"

// llama4Variant turns base into a Llama-4-style variant for tinyVariants
// (modeling_llama4.py, transformers 000c33fd): three layers, a chunked
// RoPE layer with the L2 QK-norm (chunk 2), a NoPE dense layer with
// temperature tuning (floor_scale 2, attn_scale 0.5: factors 1, 1.35, 1.35,
// 1.55, 1.55 over the five positions), and a chunked MoE layer (chunk 3);
// the sigmoid top-1 router scales the routed expert's input, one shared
// expert beside it, the experts fused with gate and up in halves,
// interleaved RoPE.
func llama4Variant(c *moe.Config) *moe.Config {
	c.ModelType = "llama4_text"
	c.Layers, c.MoELayer, c.Window = 3, []bool{true, false, true}, []int{0, 0, 0}
	c.Chunk, c.NoRope = []int{2, 0, 3}, []bool{false, true, false}
	c.Temperature = &moe.AttnTemperature{FloorScale: 2, Scale: 0.5}
	c.QKNorm, c.RopeInterleave = moe.QKNormL2Rope, true
	c.Score, c.NormTopK, c.TopK, c.RouteInput = moe.Sigmoid, false, 1, true
	c.SharedExperts, c.SharedFFN = 1, c.ExpertFFN
	c.FusedExperts, c.FusedHalves = true, true
	c.Names = moe.TensorNames{MoE: "feed_forward", Router: "router", Shared: "shared_expert", Dense: "feed_forward"}
	return c
}
