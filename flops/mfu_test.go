package flops

import "testing"

// TestMFU by hand: 16384 tokens/s at 1e9 FLOPs per token is 1.6384e13
// FLOP/s, 1.6384% of a 1e15 FLOP/s peak; HFU is the same formula on the
// hardware count.
func TestMFU(t *testing.T) {
	if got := MFU(1e9, 16384, 1e15); got != 0.016384 {
		t.Errorf("MFU = %v, want 0.016384", got)
	}
	if got := HFU(2e9, 16384, 1e15); got != 0.032768 {
		t.Errorf("HFU = %v, want 0.032768", got)
	}
	if MFU(1e9, 1, 0) != 0 || MFU(1e9, 1, -1) != 0 {
		t.Error("non-positive peak must give 0")
	}
}
