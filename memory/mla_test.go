package memory

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
)

// TestCompiledMLA lists by hand what a compiled DeepSeek-V3 block drops
// from the eager table under policy none: in the MoE layer 5 the latent
// norms' outputs (q_b_proj and kv_b_proj inputs) and the shared experts'
// silu(gate) and down input; in the dense layer 0 also the normed block
// input under q_a_proj and the dense MLP's input, silu(gate) and down input.
func TestCompiledMLA(t *testing.T) {
	c, err := hf.Load("deepseek-v3")
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		op     moe.Op
		tensor moe.Saved
	}
	for _, tc := range []struct {
		layer   int
		dropped map[key]bool
	}{
		{5, map[key]bool{{moe.OpQBProj, moe.SavedInput}: true, {moe.OpKVBProj, moe.SavedInput}: true,
			{moe.OpSharedAct, moe.SavedSiLUGate}: true, {moe.OpSharedDown, moe.SavedInput}: true}},
		{0, map[key]bool{{moe.OpQBProj, moe.SavedInput}: true, {moe.OpKVBProj, moe.SavedInput}: true, {moe.OpQAProj, moe.SavedInput}: true,
			{moe.OpDenseGate, moe.SavedInput}: true, {moe.OpDenseAct, moe.SavedSiLUGate}: true, {moe.OpDenseDown, moe.SavedInput}: true}},
	} {
		sh := Shape{Batch: 1, Seq: 8, AC: moe.AC{Mode: moe.ACNone}}
		eager, err := Saved(c, tc.layer, sh)
		if err != nil {
			t.Fatal(err)
		}
		sh.Compile = Compiled
		comp, err := Saved(c, tc.layer, sh)
		if err != nil {
			t.Fatal(err)
		}
		kept := map[key]bool{}
		for _, r := range comp {
			kept[key{r.Op, r.Tensor}] = true
		}
		n := 0
		for _, r := range eager {
			k := key{r.Op, r.Tensor}
			if kept[k] == tc.dropped[k] {
				t.Errorf("layer %d: %v kept %v, dropped by hand %v", tc.layer, k, kept[k], tc.dropped[k])
			}
			if tc.dropped[k] {
				n++
			}
		}
		if n != len(tc.dropped) || len(comp) != len(eager)-n {
			t.Errorf("layer %d: %d eager, %d compiled records, %d dropped by hand", tc.layer, len(eager), len(comp), len(tc.dropped))
		}
	}
}
