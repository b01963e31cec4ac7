package flops

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
)

// recomputeKey is one op of one layer.
type recomputeKey struct {
	layer int
	op    moe.Op
}

// recomputeCounts sums the recompute pass's counts of recs by layer and op.
func recomputeCounts(recs []moe.OpRecord) map[recomputeKey]int64 {
	m := map[recomputeKey]int64{}
	for _, r := range recs {
		if r.Pass == moe.Recompute {
			m[recomputeKey{r.Layer, r.Op}] += r.Count
		}
	}
	return m
}

// tinyTwoSequences is the tiny model, two sequences of 8 tokens, and its
// ops without checkpointing.
func tinyTwoSequences(t *testing.T) (*moe.Config, Shape, []moe.OpRecord) {
	t.Helper()
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	s := Shape{Seq: 8, Batch: 2}
	none, err := Ops(cfg, s, moe.AC{Mode: moe.ACNone}, ExactTile)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, s, none
}

// TestModulesRecomputeTiny works the recompute of Megatron's layernorm and
// moe_act modules on the built-in tiny model by hand (D 32; layer 0 dense,
// layer 1 MoE with K 2, F 16; not MLA; two sequences of 8 tokens, T 16):
// beyond flash attention's own recompute (the same as under none), only
// layer 1's pre-MLP norm repeats its forward, T·D = 512 elements (the dense
// layer's is fused into fc1 in Megatron's TE spec, attn_norm into
// linear_qkv), and layer 1's routed-expert activation, T·K·F = 512. Both
// are elementwise: the matmul FLOPs with recompute equal none's.
func TestModulesRecomputeTiny(t *testing.T) {
	cfg, s, none := tinyTwoSequences(t)
	ac, err := moe.ParseAC("modules:layernorm,moe_act")
	if err != nil {
		t.Fatal(err)
	}
	mods, err := Ops(cfg, s, ac, ExactTile)
	if err != nil {
		t.Fatal(err)
	}
	want := recomputeCounts(none) // flash attention's QKᵀ
	want[recomputeKey{1, moe.OpFFNNorm}] = 16 * 32
	want[recomputeKey{1, moe.OpExpertAct}] = 16 * 2 * 16
	got := recomputeCounts(mods)
	for k, w := range want {
		if got[k] != w {
			t.Errorf("layer %d %s: recompute %d, by hand %d", k.layer, k.op, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("recompute records %v, want exactly %v", got, want)
	}
	mn, _ := MatmulFLOPs(none, true)
	mm, _ := MatmulFLOPs(mods, true)
	if mn != mm {
		t.Errorf("matmul FLOPs with recompute: modules %d, none %d", mm, mn)
	}
}

// TestModuleMoERecomputeTiny works the moe module's recompute on the tiny
// model by hand (T 16, D 32; layer 1 MoE with E 4, K 2, F 16, no shared
// experts): Megatron's MoELayer.forward runs again, so layer 1's router
// repeats T·E·D = 2048, router_topk T·E = 64, dispatch and combine
// T·K·D = 1024 each, the three expert GEMMs T·K·F·D = 16384 each and the
// activation T·K·F = 512; the dense layer 0 and the norms nothing. The
// matmul FLOPs with recompute grow by 2·(2048 + 3·16384) = 102400. With
// layernorm and moe_act too, the pre-MLP norm adds T·D = 512 and the
// activation runs twice more than forward, 1024.
func TestModuleMoERecomputeTiny(t *testing.T) {
	cfg, s, none := tinyTwoSequences(t)
	for _, tc := range []struct {
		ac    string
		extra map[recomputeKey]int64
	}{
		{"modules:moe", map[recomputeKey]int64{{1, moe.OpExpertAct}: 512}},
		{"modules:layernorm,moe_act,moe", map[recomputeKey]int64{{1, moe.OpExpertAct}: 1024, {1, moe.OpFFNNorm}: 512}},
	} {
		ac, err := moe.ParseAC(tc.ac)
		if err != nil {
			t.Fatal(err)
		}
		recs, err := Ops(cfg, s, ac, ExactTile)
		if err != nil {
			t.Fatal(err)
		}
		want := recomputeCounts(none) // flash attention's QKᵀ
		for k, v := range map[recomputeKey]int64{{1, moe.OpRouter}: 2048, {1, moe.OpRouterTopK}: 64, {1, moe.OpDispatch}: 1024,
			{1, moe.OpExpertGate}: 16384, {1, moe.OpExpertUp}: 16384, {1, moe.OpExpertDown}: 16384, {1, moe.OpCombine}: 1024} {
			want[k] = v
		}
		for k, v := range tc.extra {
			want[k] = v
		}
		got := recomputeCounts(recs)
		for k, w := range want {
			if got[k] != w {
				t.Errorf("%s layer %d %s: recompute %d, by hand %d", tc.ac, k.layer, k.op, got[k], w)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: recompute records %v, want exactly %v", tc.ac, got, want)
		}
		mn, _ := MatmulFLOPs(none, true)
		mm, _ := MatmulFLOPs(recs, true)
		if mm-mn != 102400 {
			t.Errorf("%s: matmul FLOPs with recompute %d, none's %d + 102400 by hand", tc.ac, mm, mn)
		}
	}
}
