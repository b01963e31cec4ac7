package memory

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
)

// TestLoadedRankSavesItsRows: the most loaded expert-parallel rank, whose
// experts receive L × the mean rows, keeps L × the expert-side tensors of
// a MoE block (hand count, perLayerBytes' terms): under no checkpointing
// the dispatched rows 2KD and the experts' gate, silu(gate), up and
// product 8KF bytes per token, so L = 1.5 adds 0.5·T·(2KD + 8KF); under
// the selective policy only the dispatch's all-to-all output 2KD of them is
// kept (the combine's returns the rank's own tokens), adding 0.5·T·2KD.
// Without expert parallelism, or at L = 1, nothing changes.
func TestLoadedRankSavesItsRows(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	layer := -1
	for l := range cfg.Layers {
		if cfg.MoELayer[l] {
			layer = l
			break
		}
	}
	if layer < 0 {
		t.Fatal("tiny has no MoE layer")
	}
	const b, s = 2, 64
	T, K, D, F := int64(b*s), int64(cfg.TopK), int64(cfg.Hidden), int64(cfg.ExpertFFN)
	bytes := func(ac moe.ACMode, ep int, load float64) int64 {
		rs, err := Saved(cfg, layer, Shape{Batch: b, Seq: s, AC: moe.AC{Mode: ac}, EP: ep, ExpertLoad: load})
		if err != nil {
			t.Fatal(err)
		}
		return SavedBytes(rs)
	}
	for _, c := range []struct {
		ac   moe.ACMode
		ep   int
		load float64
		want int64 // bytes added over balanced routing
	}{
		{moe.ACNone, 2, 1.5, T * (2*K*D + 8*K*F) / 2},
		{moe.ACSelective, 2, 1.5, T * 2 * K * D / 2},
		{moe.ACNone, 1, 1.5, 0},
		{moe.ACNone, 2, 1, 0},
	} {
		if got := bytes(c.ac, c.ep, c.load) - bytes(c.ac, c.ep, 0); got != c.want {
			t.Errorf("%s, ep %d, load %v: %d bytes more than balanced, want %d", c.ac, c.ep, c.load, got, c.want)
		}
	}
}
