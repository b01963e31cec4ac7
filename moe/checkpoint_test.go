package moe

import (
	"strings"
	"testing"
)

// TestParseACModules: modules:M,… reads Megatron-Core's recompute module
// names (transformer_config.py recompute_modules at Megatron-LM d98e8a6),
// prints them in one order, and refuses the modules not built, unknown
// names, repeats and an empty list, naming the value and the built list.
func TestParseACModules(t *testing.T) {
	for _, tc := range []struct {
		in, out string
		set     RecomputeModules
	}{
		{"modules:layernorm", "modules:layernorm", RecomputeLayerNorm},
		{"modules:moe_act", "modules:moe_act", RecomputeMoEAct},
		{"modules:moe_act,layernorm", "modules:layernorm,moe_act", RecomputeLayerNorm | RecomputeMoEAct},
		{"modules:moe", "modules:moe", RecomputeMoE},
		// The ModelZoo's long-context command writes --recompute-modules
		// layernorm moe (yanring/Megatron-MoE-ModelZoo e865051,
		// best_practice/qwen3/readme.md); Megatron accepts moe beside
		// moe_act too.
		{"modules:moe,layernorm", "modules:layernorm,moe", RecomputeLayerNorm | RecomputeMoE},
		{"modules:moe,moe_act,layernorm", "modules:layernorm,moe_act,moe", RecomputeLayerNorm | RecomputeMoEAct | RecomputeMoE},
	} {
		a, err := ParseAC(tc.in)
		if err != nil || a.Mode != ACModules || a.Modules != tc.set || a.String() != tc.out {
			t.Errorf("%q: %+v (%q), %v; want modules %b printed %q", tc.in, a, a.String(), err, tc.set, tc.out)
		}
		if a.FullyCheckpointed(0) {
			t.Errorf("%q checkpoints block 0 whole", tc.in)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"modules:mlp", `"mlp" is not built; built: layernorm, moe_act`},
		{"modules:core_attn,layernorm", `"core_attn" is not built`},
		{"modules:norm", `"norm" is not a Megatron-Core recompute module; built: layernorm, moe_act`},
		{"modules:layernorm,layernorm", `"layernorm" named twice`},
		{"modules:", `"" is not a Megatron-Core recompute module`},
		{"modules:moe,moe", `"moe" named twice`},
		{"modules:shared_experts", `"shared_experts" is not built; built: layernorm, moe_act, moe`},
		{"modules", "must be none, selective, full, layer:N, modules:M,… (M among layernorm, moe_act, moe) or memory_budget:F (F in [0, 1])"},
	} {
		_, err := ParseAC(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.in) {
			t.Errorf("%q: error %v, want one naming the value and %q", tc.in, err, tc.want)
		}
	}
}

// TestModulesWhere: layernorm recomputes ffn_norm in MoE blocks and
// attn_norm in MLA blocks only (Megatron's TE spec fuses the others into
// the next linear); moe_act the routed experts of MoE blocks.
func TestModulesWhere(t *testing.T) {
	c := &Config{MoELayer: []bool{false, true}}
	a := AC{Mode: ACModules, Modules: RecomputeLayerNorm | RecomputeMoEAct}
	for _, tc := range []struct {
		l        int
		op       Op
		norm     bool
		mla, act bool
	}{
		{0, OpFFNNorm, false, false, false}, {1, OpFFNNorm, true, false, true},
		{0, OpAttnNorm, false, false, false}, {1, OpAttnNorm, false, false, true},
		{0, OpAttnNorm, true, true, false}, {1, OpAttnNorm, true, true, true},
	} {
		c.MLA = MLA{}
		if tc.mla {
			c.MLA = MLA{KVRank: 4}
		}
		if got := a.NormRecomputed(c, tc.l, tc.op); got != tc.norm {
			t.Errorf("block %d %s (mla %v): recomputed %v, want %v", tc.l, tc.op, tc.mla, got, tc.norm)
		}
		if got := a.ActRecomputed(c, tc.l); got != tc.act {
			t.Errorf("block %d: moe_act %v, want %v", tc.l, got, tc.act)
		}
	}
	if (AC{Mode: ACNone}).NormRecomputed(c, 1, OpFFNNorm) || (AC{Mode: ACModules, Modules: RecomputeMoEAct}).NormRecomputed(c, 1, OpFFNNorm) {
		t.Error("a policy without layernorm recomputes a norm")
	}
}

// AC.Validate refuses what no model runs (layer:0, modules with none) by
// naming it, and passes every policy ParseAC builds.
func TestACValidate(t *testing.T) {
	for _, c := range []struct {
		ac   AC
		want string
	}{{AC{Mode: ACLayer}, "layer:N needs N ≥ 1"}, {AC{Mode: ACModules}, "needs at least one module"}} {
		if err := c.ac.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.ac, err, c.want)
		}
	}
	for _, s := range []string{"none", "selective", "full", "layer:2", "modules:layernorm,moe_act", "modules:moe"} {
		a, err := ParseAC(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Validate(); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
}
