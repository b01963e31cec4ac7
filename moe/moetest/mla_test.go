package moetest

import (
	"math/rand/v2"
	"testing"

	"github.com/moescope/moescope/moe"
)

// TestMLACoverage checks that MLAConfig draws every MLA type and each
// option of the family within 300 draws, each a valid config.
func TestMLACoverage(t *testing.T) {
	options := []struct {
		name string
		has  func(*moe.Config) bool
	}{
		{"query latent", func(c *moe.Config) bool { return c.MLA.QRank > 0 }},
		{"no query latent", func(c *moe.Config) bool { return c.MLA.QRank == 0 }},
		{"v ≠ q·k head dim", func(c *moe.Config) bool { return c.MLA.V != c.HeadDim }},
		{"dense and MoE layers", func(c *moe.Config) bool { return c.IsMoE() && c.MoELayers() < c.Layers }},
		{"sigmoid grouped top-k", func(c *moe.Config) bool { return c.Score == moe.Sigmoid && c.TopKGroups < c.Groups }},
		{"softmax grouped top-k", func(c *moe.Config) bool { return c.Score == moe.Softmax && c.TopKGroups < c.Groups }},
		{"shared experts", func(c *moe.Config) bool { return c.SharedExperts > 0 }},
		{"interleaved RoPE", func(c *moe.Config) bool { return c.RopeInterleave }},
		{"MTP layers", func(c *moe.Config) bool { return c.MTPLayers > 0 }},
	}
	r := rand.New(rand.NewPCG(3, 4))
	types := map[string]bool{}
	seen := make([]bool, len(options))
	for range 300 {
		c := MLAConfig(r)
		if !c.IsMLA() {
			t.Fatalf("%s: not MLA", c.ModelType)
		}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		types[c.ModelType] = true
		for j, o := range options {
			seen[j] = seen[j] || o.has(c)
		}
	}
	for _, mt := range MLAModelTypes() {
		if !types[mt] {
			t.Errorf("model_type %s not drawn", mt)
		}
	}
	for j, o := range options {
		if !seen[j] {
			t.Errorf("%s: not drawn", o.name)
		}
	}
}
