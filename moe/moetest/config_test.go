package moetest

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/ref"
)

// draws is how many configs the coverage test draws: every model type and
// every option below must appear within them.
const draws = 300

// notExecuted lists the model types the loader and the accounting read but
// the reference (moe/ref) does not execute yet, so that no draw can run:
// each names what moe/ref refuses. Config must draw every other type, and
// these as soon as moe/ref executes them. None today.
var notExecuted = map[string]string{}

// supportedExecuted is hf.SupportedModelTypes less notExecuted.
func supportedExecuted() []string {
	return slices.DeleteFunc(hf.SupportedModelTypes(), func(t string) bool { _, ok := notExecuted[t]; return ok })
}

func TestModelTypesAreSupported(t *testing.T) {
	if got, want := ModelTypes(), supportedExecuted(); !slices.Equal(got, want) {
		t.Errorf("Config draws model types %v; the loader supports %v, of which moe/ref executes %v", got, hf.SupportedModelTypes(), want)
	}
}

// TestCoverage checks that within draws configs every model type and
// every option occurs, and that every Config field takes at least two
// values (a field added to Config and not drawn fails here), and that each
// draw builds a model.
func TestCoverage(t *testing.T) {
	moeLayers := func(c *moe.Config) bool { return c.IsMoE() }
	options := []struct {
		name string
		has  func(*moe.Config) bool
	}{
		{"dense model", func(c *moe.Config) bool { return !c.IsMoE() }},
		{"MoE layers only", func(c *moe.Config) bool { return c.MoELayers() == c.Layers }},
		{"dense and MoE layers", func(c *moe.Config) bool { return c.IsMoE() && c.MoELayers() < c.Layers }},
		{"sliding window", func(c *moe.Config) bool {
			return slices.ContainsFunc(c.Window, func(w int) bool { return w > 0 && w < 7 })
		}},
		{"window wider than a test sequence", func(c *moe.Config) bool { return slices.Contains(c.Window, 4096) }},
		{"sliding and full layers", func(c *moe.Config) bool {
			return slices.Contains(c.Window, 0) && slices.ContainsFunc(c.Window, func(w int) bool { return w > 0 })
		}},
		{"grouped-query attention", func(c *moe.Config) bool { return c.KVHeads < c.Heads }},
		{"head_dim ≠ hidden/heads", func(c *moe.Config) bool { return c.Heads*c.HeadDim != c.Hidden }},
		{"top-k of every expert", func(c *moe.Config) bool { return moeLayers(c) && c.TopK == c.Experts }},
		{"top-1", func(c *moe.Config) bool { return moeLayers(c) && c.TopK == 1 }},
		{"renormalized top-k", func(c *moe.Config) bool { return moeLayers(c) && c.NormTopK }},
		{"plain top-k", func(c *moe.Config) bool { return moeLayers(c) && !c.NormTopK }},
		{"shared expert", func(c *moe.Config) bool { return moeLayers(c) && c.SharedExperts == 1 }},
		{"several shared experts", func(c *moe.Config) bool { return moeLayers(c) && c.SharedExperts > 1 }},
		{"gated shared expert", func(c *moe.Config) bool { return moeLayers(c) && c.SharedGated }},
		{"sigmoid router with selection bias", func(c *moe.Config) bool { return moeLayers(c) && c.Score == moe.Sigmoid && c.SelectionBias }},
		{"routed scale ≠ 1", func(c *moe.Config) bool { return moeLayers(c) && c.RoutedScale != 1 }},
		{"grouped top-k", func(c *moe.Config) bool { return moeLayers(c) && c.Groups > 1 }},
		{"fewer kept groups than groups", func(c *moe.Config) bool { return moeLayers(c) && c.TopKGroups < c.Groups }},
		{"aux loss added (output_router_logits)", func(c *moe.Config) bool { return moeLayers(c) && c.OutputRouterLogits && c.AuxLossCoef > 0 }},
		{"QK norm none", func(c *moe.Config) bool { return c.QKNorm == moe.QKNormNone }},
		{"QK norm per head", func(c *moe.Config) bool { return c.QKNorm == moe.QKNormHead }},
		{"QK norm full", func(c *moe.Config) bool { return c.QKNorm == moe.QKNormFull }},
		{"QKV bias", func(c *moe.Config) bool { return c.QKVBias }},
		{"partial rotary", func(c *moe.Config) bool { return c.RotaryFraction < 1 }},
		{"tied embeddings", func(c *moe.Config) bool { return c.TiedEmbeddings }},
		{"YaRN rope scaling", func(c *moe.Config) bool { return c.Yarn != nil }},
		{"YaRN softmax scale", func(c *moe.Config) bool { return c.AttnScale != 0 }},
		{"attention sinks with o_proj bias", func(c *moe.Config) bool { return c.AttnSinks && c.OProjBias }},
		{"attention sinks without biases", func(c *moe.Config) bool { return c.AttnSinks && !c.QKVBias }},
		{"fused biased experts, clamped SwiGLU", func(c *moe.Config) bool { return c.FusedExperts && c.ExpertBias && c.Clamp != nil }},
		{"chunked layer, chunk < 6", func(c *moe.Config) bool {
			return slices.ContainsFunc(c.Chunk, func(n int) bool { return n > 0 && n < 6 })
		}},
		{"NoPE and RoPE layers", func(c *moe.Config) bool { return slices.Contains(c.NoRope, true) && slices.Contains(c.NoRope, false) }},
		{"L2 QK-norm with a NoPE layer", func(c *moe.Config) bool { return c.QKNorm == moe.QKNormL2Rope && slices.Contains(c.NoRope, true) }},
		{"temperature, floor_scale 1", func(c *moe.Config) bool { return c.Temperature != nil && c.Temperature.FloorScale == 1 }},
		{"input-scaled routing, dense and MoE layers", func(c *moe.Config) bool { return c.RouteInput && c.MoELayers() < c.Layers }},
		{"input-scaled top-1 with a shared expert", func(c *moe.Config) bool { return c.RouteInput && c.TopK == 1 && c.SharedExperts == 1 }},
		{"fused experts in halves", func(c *moe.Config) bool { return c.FusedHalves && c.MoELayers() > 0 }},
	}
	// Fields that keep one value in every draw, and why.
	constant := map[string]string{
		"Source": "no draw names a source",
	}
	r := rand.New(rand.NewPCG(1, 2))
	types := map[string]int{}
	seen := make([]bool, len(options))
	fieldValues := map[string]map[string]bool{}
	ct := reflect.TypeFor[moe.Config]()
	for i := 0; i < draws; i++ {
		c := Config(r)
		if _, err := ref.NewModel[float32](c); err != nil {
			t.Fatalf("draw %d: %v", i, err)
		}
		types[c.ModelType]++
		for j, o := range options {
			seen[j] = seen[j] || o.has(c)
		}
		v := reflect.ValueOf(*c)
		for f := range ct.NumField() {
			name := ct.Field(f).Name
			if fieldValues[name] == nil {
				fieldValues[name] = map[string]bool{}
			}
			fieldValues[name][fmt.Sprint(v.Field(f).Interface())] = true
		}
	}
	for _, mt := range supportedExecuted() {
		if types[mt] == 0 {
			t.Errorf("model_type %s: not drawn in %d configs", mt, draws)
		}
	}
	for j, o := range options {
		if !seen[j] {
			t.Errorf("%s: not drawn in %d configs", o.name, draws)
		}
	}
	for name, vs := range fieldValues {
		if _, ok := constant[name]; ok {
			if len(vs) != 1 {
				t.Errorf("Config.%s takes %d values; the test expects one (%s)", name, len(vs), constant[name])
			}
		} else if len(vs) < 2 {
			t.Errorf("Config.%s takes one value in %d configs: the generator does not vary it", name, draws)
		}
	}
}

// TestDeterministic: the same seed draws the same configs.
func TestDeterministic(t *testing.T) {
	a, b := rand.New(rand.NewPCG(7, 8)), rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 50; i++ {
		if ca, cb := Config(a), Config(b); !reflect.DeepEqual(ca, cb) {
			t.Fatalf("draw %d differs:\n%+v\n%+v", i, ca, cb)
		}
	}
}
