package attn

import (
	"slices"
	"testing"
)

// TestPackKV: two tokens of width 2, packed by hand as k0 v0 k1 v1; the
// packed rows added back land in k and v.
func TestPackKV(t *testing.T) {
	k, v := []float32{1, 2, 3, 4}, []float32{5, 6, 7, 8}
	kv := PackKV(k, v, 2)
	if want := []float32{1, 2, 5, 6, 3, 4, 7, 8}; !slices.Equal(kv, want) {
		t.Fatalf("PackKV = %v, want %v", kv, want)
	}
	dk, dv := make([]float32, 4), []float32{1, 1, 1, 1}
	UnpackAddKV(dk, dv, kv, 2)
	if !slices.Equal(dk, k) || !slices.Equal(dv, []float32{6, 7, 8, 9}) {
		t.Errorf("UnpackAddKV: dk %v, dv %v", dk, dv)
	}
}
