package moe

import (
	"slices"
	"strings"
	"testing"
)

// TestBudgetCacheHand: the memory budget's knapsack on a dense block worked
// by hand. D = 4, H = 2 heads of d = 4, G = 1, Fd = 8, bf16, seq 32; per
// token, bytes:
//
//	none keeps x 8, rstd 4, q_proj input 8, q 16, k 8, v 8, output 16,
//	lse 8, ffn_norm input 8, rstd 4, gate input 8, gate 16, silu 16, up 16,
//	down input 16: 160; the input 8, so the range is 152.
//	items (bytes, FLOPs = 2·in·out; attention 2·H·s·(d+dv) = 32·32):
//	q (16, 64), k (8, 32), v (8, 32), attention (16+8, 1024), o (8, 64),
//	gate (16, 64), up (16, 64); down_proj's output reaches only the
//	block's output and is no item.
//
// F = 0.1: 15.2 bytes: o alone (attention weighs 24). F = 0.25: 38 bytes:
// attention and o (32; every other item weighs ≥ 8 more). F = 0.7: 106.4
// bytes ≥ the items' 96: all of them.
func TestBudgetCacheHand(t *testing.T) {
	c := &Config{Hidden: 4, Heads: 2, KVHeads: 1, HeadDim: 4, DenseFFN: 8, Layers: 1, MoELayer: []bool{false}, Vocab: 8, QKNorm: QKNormNone}
	for _, tc := range []struct {
		f    float64
		want Cache
	}{
		{0.1, Cache{Linears: []Op{OpOProj}}},
		{0.25, Cache{Linears: []Op{OpOProj}, Attn: true}},
		{0.7, Cache{Linears: []Op{OpQProj, OpKProj, OpVProj, OpOProj, OpDenseGate, OpDenseUp}, Attn: true}},
	} {
		got, ok := AC{Mode: ACMemoryBudget, Budget: tc.f}.Cached(c, 0, 32, BF16)
		if !ok || !slices.Equal(got.Linears, tc.want.Linears) || got.Attn != tc.want.Attn || got.TopK {
			t.Errorf("F = %g: cache %+v (%v), want %+v", tc.f, got, ok, tc.want)
		}
	}
	// The range's ends: F = 0 keeps the input alone, F = 1 the table of none.
	none := SavedTensors(c, 0, 1, 32, AC{Mode: ACNone}, Precision{})
	if len(none) != 15 {
		t.Fatalf("none keeps %d tensors, want the 15 listed above", len(none))
	}
	if got := SavedTensors(c, 0, 1, 32, AC{Mode: ACMemoryBudget, Budget: 1}, Precision{}); !slices.Equal(got, none) {
		t.Errorf("memory_budget:1 keeps %v, want none's %v", got, none)
	}
	if got := SavedTensors(c, 0, 1, 32, AC{Mode: ACMemoryBudget}, Precision{}); len(got) != 1 || got[0] != none[0] {
		t.Errorf("memory_budget:0 keeps %v, want the block's input %v", got, none[0])
	}
}

// TestParseMemoryBudget: memory_budget:F reads F in [0, 1], prints it back,
// and refuses any other value naming it and the range.
func TestParseMemoryBudget(t *testing.T) {
	for _, s := range []string{"memory_budget:0", "memory_budget:0.5", "memory_budget:1"} {
		a, err := ParseAC(s)
		if err != nil || a.Mode != ACMemoryBudget || a.String() != s || a.Validate() != nil {
			t.Errorf("%s: %+v, %v", s, a, err)
		}
	}
	for _, s := range []string{"memory_budget:1.5", "memory_budget:-0.1", "memory_budget:NaN", "memory_budget:", "memory_budget:half"} {
		_, err := ParseAC(s)
		if err == nil || !strings.Contains(err.Error(), s) || !strings.Contains(err.Error(), "[0, 1]") {
			t.Errorf("%q: error %v, want one naming the value and [0, 1]", s, err)
		}
	}
	if err := (AC{Mode: ACMemoryBudget, Budget: 2}).Validate(); err == nil || !strings.Contains(err.Error(), "[0, 1]") {
		t.Errorf("budget 2: %v, want an error naming [0, 1]", err)
	}
}
