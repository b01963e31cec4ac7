package job

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
)

// TestCheckModelRefusesCPWithChunks: context parallelism's price assumes the
// full causal mask, so Llama 4's chunked layers under cp > 1 are refused by
// name; cp = 1 accepts them.
func TestCheckModelRefusesCPWithChunks(t *testing.T) {
	c := &moe.Config{Vocab: 32, Hidden: 8, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 4, DenseFFN: 6,
		MoELayer: []bool{false, false}, Window: []int{0, 0}, Chunk: []int{4, 0},
		QKNorm: moe.QKNormNone, RotaryFraction: 1, RopeTheta: 10000, NormEps: 1e-6, InitRange: 0.1}
	for _, tc := range []struct {
		cp   int
		fail bool
	}{{1, false}, {2, true}} {
		l := Layout{GPUs: 2, CP: tc.cp}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		err := l.CheckModel(c)
		if tc.fail != (err != nil) || (err != nil && !strings.Contains(err.Error(), "chunked attention")) {
			t.Errorf("cp %d: %v; want refusal %v naming chunked attention", tc.cp, err, tc.fail)
		}
	}
}
