package bench

import (
	"fmt"
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

// TestBenchExpertsBlamedForMemory (issue 17, defect 12): bench --experts 0
// (qwen3-30b-a3b's own 128 experts) on a machine that cannot hold the
// layer's weights blamed --tokens, which no value could fix; the refusal
// now names --experts with the largest count that fits. By hand: the 128
// experts of 2048 × 768 take 3·2048·768·128 ≈ 604M parameters, with
// gradients and two AdamW moments at least 16 B each ≈ 9 GiB, doubled by
// host.HeapFactor ≥ 18 GiB, over 16 GiB at any token count.
func TestBenchExpertsBlamedForMemory(t *testing.T) {
	cfg, err := hf.Load("qwen3-30b-a3b")
	if err != nil {
		t.Fatal(err)
	}
	lc, err := LayerConfig(cfg, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	const avail = 16 << 30
	for _, tokens := range []int{1, 2048} {
		err := CheckMemory(lc, tokens, avail)
		if err == nil || !strings.HasPrefix(err.Error(), "--experts: the layer's 128 experts") || !strings.Contains(err.Error(), "give --experts in [4, ") {
			t.Fatalf("--tokens %d: %v, want --experts blamed", tokens, err)
		}
		// The bound it gives is exact: that many experts fit, one more does not.
		var hi int
		if _, err := fmt.Sscanf(err.Error()[strings.Index(err.Error(), "give --experts in [4, ")+len("give --experts in [4, "):], "%d]", &hi); err != nil {
			t.Fatal(err)
		}
		if hi < 4 || hi >= 128 {
			t.Fatalf("--tokens %d: bound %d", tokens, hi)
		}
		for e, fits := range map[int]bool{hi: true, hi + 1: false} {
			l, err := LayerConfig(cfg, e, 4)
			if err != nil {
				t.Fatal(err)
			}
			if got := CheckMemory(l, tokens, avail) == nil; got != fits {
				t.Errorf("--tokens %d, %d experts: fits %v, want %v", tokens, e, got, fits)
			}
		}
	}
	// Too many tokens with few experts still blames --tokens.
	l16, _ := LayerConfig(cfg, 16, 4)
	if err := CheckMemory(l16, 1<<20, avail); err == nil || !strings.HasPrefix(err.Error(), "--tokens 1048576") {
		t.Errorf("16 experts, 2^20 tokens: %v", err)
	}
}
