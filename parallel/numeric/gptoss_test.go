package numeric

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/moetest"
)

// TestRefuseGPTOSS: each GPT-OSS and Llama 4 field the ranks do not run is refused by
// its name, and a config without them passes.
func TestRefuseGPTOSS(t *testing.T) {
	base := func() *moe.Config { return moetest.ConfigOf(rand.New(rand.NewPCG(1, 2)), "qwen3_moe") }
	if err := refuseGPTOSS(base()); err != nil {
		t.Errorf("qwen3_moe: %v, want nil", err)
	}
	for _, tc := range []struct {
		name string
		set  func(c *moe.Config)
	}{
		{"attn_sinks", func(c *moe.Config) { c.AttnSinks = true }},
		{"o_proj_bias", func(c *moe.Config) { c.OProjBias = true }},
		{"router_bias", func(c *moe.Config) { c.RouterBias = true }},
		{"expert_bias", func(c *moe.Config) { c.ExpertBias = true }},
		{"swiglu_clamp", func(c *moe.Config) { c.Clamp = &moe.SwiGLUClamp{Alpha: 1.702, Limit: 7} }},
		{"fused_experts", func(c *moe.Config) { c.FusedExperts = true }},
		{"chunk", func(c *moe.Config) { c.Chunk = make([]int, c.Layers); c.Chunk[0] = 4 }},
		{"no_rope", func(c *moe.Config) { c.NoRope = make([]bool, c.Layers); c.NoRope[0] = true }},
		{"qk_norm l2_rope", func(c *moe.Config) { c.QKNorm = moe.QKNormL2Rope }},
		{"attn_temperature", func(c *moe.Config) { c.Temperature = &moe.AttnTemperature{FloorScale: 8, Scale: 0.1} }},
		{"route_input", func(c *moe.Config) { c.Score, c.RouteInput = moe.Sigmoid, true }},
		{"fused_halves", func(c *moe.Config) { c.FusedExperts, c.FusedHalves = true, true }},
	} {
		c := base()
		tc.set(c)
		if err := refuseGPTOSS(c); err == nil || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s: %v, want an error naming it", tc.name, err)
		}
	}
}
