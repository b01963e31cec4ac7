package job

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
)

// TestQuantizeRules: the GEMM sets a recipe converts, by default and as
// stated, and what is refused, each naming the field (DESIGN's
// --quantize; the defaults are torchtitan's converters with the output
// filtered and TransformerEngine's modules, DefaultQuantize's comment).
func TestQuantizeRules(t *testing.T) {
	for _, c := range []struct {
		p     Precision
		q     Quantize
		want  string // converted sets, or the error's words
		fails bool
	}{
		{BF16, nil, "", false},
		{FP8Tensorwise, nil, "linear", false},
		{FP8Current, nil, "linear, experts", false},
		{MXFP8, nil, "linear, experts", false},
		{MXFP8, Quantize{QuantExperts}, "experts", false},
		{MXFP8, Quantize{QuantLinear, QuantOutput}, "linear, output", false},
		{BF16, Quantize{QuantLinear}, "empty with precision bf16", true},
		{MXFP8, Quantize{QuantAttention}, "FP8 attention is not priced yet", true},
		{FP8Tensorwise, Quantize{QuantExperts}, "no tensorwise grouped GEMM", true},
		{MXFP8, Quantize{QuantLinear, QuantLinear}, "each set once", true},
		{MXFP8, Quantize{"router"}, "must be one of", true},
	} {
		r := DefaultRecipe()
		r.Precision, r.Quantize = c.p, c.q
		err := r.Resolve()
		switch {
		case c.fails && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "quantize")):
			t.Errorf("%s %v: %v, want an error on quantize saying %q", c.p, c.q, err, c.want)
		case !c.fails && (err != nil || r.Converted().String() != c.want):
			t.Errorf("%s %v: converts %q (%v), want %q", c.p, c.q, r.Converted(), err, c.want)
		}
	}
}

// TestFP8AllGather: tensorwise only; what it gathers in fp8 (GathersFP8):
// the converted linears' 2D weights, never experts or norms.
func TestFP8AllGather(t *testing.T) {
	r := DefaultRecipe()
	r.Precision, r.FP8AllGather = MXFP8, true
	if err := r.Resolve(); err == nil || !strings.Contains(err.Error(), "fp8_all_gather") {
		t.Errorf("mxfp8 with fp8_all_gather: %v, want a refusal", err)
	}
	r.Precision = FP8Tensorwise
	if err := r.Resolve(); err != nil {
		t.Errorf("fp8-tensorwise with fp8_all_gather: %v", err)
	}
	q := moe.Param{Shape: []int{4096, 4096}, Group: moe.GroupAttention}
	head := moe.Param{Shape: []int{128256, 4096}, Group: moe.GroupLMHead}
	norm := moe.Param{Shape: []int{4096}, Group: moe.GroupNorm}
	expert := moe.Param{Shape: []int{768, 2048}, Group: moe.GroupRouted}
	gate := moe.Param{Shape: []int{1, 2048}, Group: moe.GroupShared}
	if !r.GathersFP8(q) || r.GathersFP8(head) || r.GathersFP8(norm) || r.GathersFP8(expert) || r.GathersFP8(gate) {
		t.Error("fp8-tensorwise with fp8_all_gather: want q_proj only of q, head, norm, expert, 1×D gate")
	}
	r.Quantize = Quantize{QuantLinear, QuantOutput}
	if !r.GathersFP8(head) {
		t.Error("head not gathered in fp8 with output converted")
	}
	r.FP8AllGather = false
	if r.GathersFP8(q) {
		t.Error("gathered in fp8 without fp8_all_gather")
	}
}

// TestPrecisionCheck: every recipe of DESIGN's list is priced; a name
// outside it is refused naming the field and listing them.
func TestPrecisionCheck(t *testing.T) {
	for _, p := range []Precision{"bf16", "fp8-tensorwise", "fp8-rowwise", "mxfp8", "fp8-delayed", "fp8-current", "fp8-blockwise", "nvfp4"} {
		if err := p.Check("precision"); err != nil {
			t.Errorf("%s: %v, want priced", p, err)
		}
	}
	if err := Precision("fp6").Check("precision"); err == nil || !strings.Contains(err.Error(), "precision") || !strings.Contains(err.Error(), "fp8-blockwise") {
		t.Errorf("fp6: %v, want refused naming the field and listing the recipes", err)
	}
}

// TestRowwiseGWHP: torchao's rowwise_with_gw_hp is a variant of
// fp8-rowwise only.
func TestRowwiseGWHP(t *testing.T) {
	r := DefaultRecipe()
	r.Precision, r.FP8RowwiseGWHP = FP8Current, true
	if err := r.Resolve(); err == nil || !strings.Contains(err.Error(), "fp8_rowwise_gw_hp") {
		t.Errorf("fp8-current with fp8_rowwise_gw_hp: %v, want refused naming the field", err)
	}
	r.Precision = FP8Rowwise
	if err := r.Resolve(); err != nil {
		t.Errorf("fp8-rowwise with fp8_rowwise_gw_hp: %v", err)
	}
}
