package flops

import "testing"

// TestTPSMFU by hand: 8 sequences of 4096 tokens in 2 s is 16384 tokens/s;
// at 1e9 FLOPs per token that is 1.6384e13 FLOP/s, 1.6384% of a 1e15
// FLOP/s peak; HFU is the same formula on the hardware count.
func TestTPSMFU(t *testing.T) {
	if got := TPS(8*4096, 2); got != 16384 {
		t.Errorf("TPS = %v, want 16384", got)
	}
	if got := MFU(1e9, 16384, 1e15); got != 0.016384 {
		t.Errorf("MFU = %v, want 0.016384", got)
	}
	if got := HFU(2e9, 16384, 1e15); got != 0.032768 {
		t.Errorf("HFU = %v, want 0.032768", got)
	}
	if TPS(100, 0) != 0 || TPS(100, -1) != 0 || MFU(1e9, 1, 0) != 0 {
		t.Error("non-positive seconds or peak must give 0")
	}
}
