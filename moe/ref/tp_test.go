package ref

import (
	"github.com/moescope/moescope/moe"
	"slices"
	"testing"
)

// TestTPShard: pieces of small tensors written out by hand — dim 0 of an
// uneven [3, 2] over 2 (rows 0–1, then row 2 and a zero padding row, as
// torch's Shard(0) chunks ⌈3/2⌉ rows), dim 1 of [2, 4] over 2 (columns
// 0–1 and 2–3 of each row), a replicated [3] whole on both — and
// TPUnshard putting them back (copied, or added, member 0 only for a
// replicated tensor).
func TestTPShard(t *testing.T) {
	rows := moe.Param{Shape: []int{3, 2}, TP: moe.TPDim0}
	cols := moe.Param{Shape: []int{2, 4}, TP: moe.TPDim1}
	rep := moe.Param{Shape: []int{3}, TP: moe.TPReplicated}
	for _, c := range []struct {
		p      moe.Param
		full   []float32
		pieces [][]float32
	}{
		{rows, []float32{1, 2, 3, 4, 5, 6}, [][]float32{{1, 2, 3, 4}, {5, 6, 0, 0}}},
		{cols, []float32{1, 2, 3, 4, 5, 6, 7, 8}, [][]float32{{1, 2, 5, 6}, {3, 4, 7, 8}}},
		{rep, []float32{1, 2, 3}, [][]float32{{1, 2, 3}, {1, 2, 3}}},
	} {
		back := make([]float32, len(c.full))
		sum := make([]float32, len(c.full))
		for idx, want := range c.pieces {
			got := TPShard(c.p, c.full, 2, idx)
			if !slices.Equal(got, want) {
				t.Errorf("%v split %d piece %d = %v, want %v", c.p.Shape, c.p.TP, idx, got, want)
			}
			TPUnshard(c.p, got, back, 2, idx, false)
			TPUnshard(c.p, got, sum, 2, idx, true)
		}
		if !slices.Equal(back, c.full) || !slices.Equal(sum, c.full) {
			t.Errorf("%v split %d: put back %v (added %v), want %v", c.p.Shape, c.p.TP, back, sum, c.full)
		}
	}
}

// TestTPLocal: a tp rank's shapes, by hand for tiny-like dimensions.
func TestTPLocal(t *testing.T) {
	c := &moe.Config{Heads: 8, KVHeads: 4, DenseFFN: 48, SharedExperts: 2, SharedFFN: 6, ExpertFFN: 16, Vocab: 30}
	l := TPLocal(c, 4, 2)
	if l.Heads != 2 || l.KVHeads != 1 || l.DenseFFN != 12 || l.SharedExperts*l.SharedFFN != 3 || l.ExpertFFN != 8 || l.Vocab != 8 {
		t.Errorf("TPLocal(4, 2) = heads %d kv %d dense %d shared %d×%d experts %d vocab %d; want 2 1 12 3 8 8",
			l.Heads, l.KVHeads, l.DenseFFN, l.SharedExperts, l.SharedFFN, l.ExpertFFN, l.Vocab)
	}
	if c.Heads != 8 {
		t.Error("TPLocal changed its receiver")
	}
}
