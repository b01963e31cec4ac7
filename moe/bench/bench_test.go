package bench

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe/hf"
)

// TestBenchMemoryGuard: a layer benchmark that cannot fit is refused before
// it runs (--tokens 1048576 was once allowed and ran out of memory). By
// hand for qwen3-30b-a3b's layer cut to 16 experts, top-4: at 2^20 tokens
// one [T, D = 2048] float32 tensor is 2^20·2048·4 B = 8 GiB and the layer
// keeps several, far over 16 GiB; at 2048 tokens the layer's ~94M
// parameters with gradients and two moments take 4·4·94M B ≈ 1.4 GiB and
// the activations a few hundred MiB, so even doubled it fits 16 GiB.
func TestBenchMemoryGuard(t *testing.T) {
	cfg, err := hf.Load("qwen3-30b-a3b")
	if err != nil {
		t.Fatal(err)
	}
	lc, err := LayerConfig(cfg, 16, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckMemory(lc, 1<<20, 16<<30); err == nil || !strings.Contains(err.Error(), "--tokens 1048576") {
		t.Errorf("2^20 tokens in 16 GiB: %v, want a refusal", err)
	}
	if err := CheckMemory(lc, 2048, 16<<30); err != nil {
		t.Errorf("2048 tokens in 16 GiB: %v", err)
	}
	if err := CheckMemory(lc, 1<<20, 0); err != nil {
		t.Errorf("unknown memory must not refuse: %v", err)
	}
}
