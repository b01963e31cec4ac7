package ref

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/moetest"
)

// TestNewModelRefusesUnbuilt: each Llama 4 field the reference does not
// execute yet is refused by its name, never run as another model.
func TestNewModelRefusesUnbuilt(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(c *moe.Config)
	}{
		{"chunk", func(c *moe.Config) { c.Chunk = make([]int, c.Layers); c.Chunk[0] = 4 }},
		{"no_rope", func(c *moe.Config) { c.NoRope = make([]bool, c.Layers); c.NoRope[0] = true }},
		{"qk_norm l2_rope", func(c *moe.Config) { c.QKNorm = moe.QKNormL2Rope }},
		{"attn_temperature", func(c *moe.Config) { c.Temperature = &moe.AttnTemperature{FloorScale: 8, Scale: 0.1} }},
		{"route_input", func(c *moe.Config) { c.Score, c.RouteInput = moe.Sigmoid, true }},
		{"fused_halves", func(c *moe.Config) { c.FusedExperts, c.FusedHalves = true, true }},
	} {
		c := moetest.ConfigOf(rand.New(rand.NewPCG(1, 2)), "qwen3_moe")
		tc.set(c)
		if _, err := NewModel[float64](c); err == nil || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s: NewModel error %v, want one naming it", tc.name, err)
		}
	}
}
