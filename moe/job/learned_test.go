package job

import (
	"math"
	"testing"

	"github.com/moescope/moescope/moe"
)

// TestLearnedSkewHandWorked: LearnedSkew against its formula worked by
// hand, with E[max of 8 standard normals] = 1.42360 from H. L. Harter's
// table of expected normal order statistics (Biometrika 48, 1961).
// 128 experts, top-8, ep 8, lbs 2 × seq 4096: T = 8192 tokens per rank,
// T·k = 65536 rows; at router spread c = 0.5 the relative variance is
// 0.25·8/128 + (1 − 1/8)/65536 = 0.015625 + 0.0000133514 = 0.0156383514,
// its root 0.1250534, so the most loaded rank holds 1 + 1.42360·0.1250534
// = 1.178026× the mean. tp 2 and cp 2 each halve T (the sampling term
// quadruples: 0.015625 + 0.0000534058, root 0.1252133, 1.178253×); a
// pipeline's micro-batch of 1 sequence halves it once more from lbs 2.
func TestLearnedSkewHandWorked(t *testing.T) {
	cfg := &moe.Config{Hidden: 64, Layers: 2, Heads: 8, KVHeads: 4, HeadDim: 8, Vocab: 100,
		Experts: 128, TopK: 8, ExpertFFN: 24, MoELayer: []bool{true, true}}
	s := Spec{Model: cfg, Layout: Layout{GPUs: 8, DPShard: 8, DPReplicate: 1, EP: 8}, Batch: Batch{LBS: 2, Seq: 4096}}
	for _, c := range []struct {
		name string
		edit func(*Spec)
		want float64
	}{
		{"ep 8", func(*Spec) {}, 1.178026},
		{"tp 2, cp 2", func(s *Spec) { s.TP, s.CP = 2, 2 }, 1.178253},
		{"ep 1", func(s *Spec) { s.EP = 1 }, 1},
	} {
		sc := s
		c.edit(&sc)
		if got := sc.LearnedSkew(0.5); math.Abs(got-c.want) > 2e-6 {
			t.Errorf("%s: %.6f, want %.6f", c.name, got, c.want)
		}
	}
	// A spread no layout can hold is capped at the layout's bound:
	// ep·min(k, E/ep)/k = 8.
	if got := s.LearnedSkew(100); got != 8 {
		t.Errorf("c = 100: %v, want the bound 8", got)
	}
	// RoutedTokens under a pipeline: its micro-batch, not the local batch.
	sp := s
	sp.PP, sp.PPMicrobatchSize = 2, 1
	if got := sp.RoutedTokens(); got != 4096 {
		t.Errorf("pp micro-batch 1 of seq 4096: %d tokens, want 4096", got)
	}
}
