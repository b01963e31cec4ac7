package numeric

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/parallel"
)

// tpModel is a tiny model every tp ≤ 4 splits: 4 query and 4 KV heads, a
// dense first layer (FFN 8), a MoE layer with 4 experts of width 8 and a
// σ-gated shared expert of width 4, and a vocabulary of 30 that tp 4 splits
// unevenly (chunks of 8, the last padded by 2 rows).
func tpModel(t *testing.T) *moe.Config {
	t.Helper()
	cfg := moetest.TinyMoE()
	cfg.Vocab, cfg.Heads, cfg.KVHeads = 30, 4, 4
	cfg.MoELayer = []bool{false, true}
	cfg.DenseFFN, cfg.ExpertFFN = 8, 8
	cfg.SharedExperts, cfg.SharedFFN, cfg.SharedGated = 1, 4, true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestNumericTPEqualsOneRank: tensor parallelism with sequence parallelism
// (2 and 4 ranks), with FSDP (dp_shard 2 × tp 2) and with expert
// parallelism at etp = tp trains 3 steps as one rank does on the same
// global batch (the tp ranks share their data-parallel rank's sequences),
// losses and parameters within 1e-5 relative: not bitwise, since the
// row-parallel linears and the replicated tensors' gradients sum partial
// products over the group, in another order than one rank's GEMM. Every
// checkpointing policy runs, with the aux loss on.
func TestNumericTPEqualsOneRank(t *testing.T) {
	cfg := tpModel(t)
	cases := []rankCase{
		{gpus: 2, rep: 1, ep: 1, micro: 4, tp: 2},
		{gpus: 4, rep: 1, ep: 1, micro: 4, tp: 4},
		{gpus: 4, rep: 1, ep: 1, micro: 2, tp: 2},         // dp_shard 2 × tp 2
		{gpus: 4, rep: 1, ep: 2, micro: 2, tp: 2, etp: 2}, // ep 2 over dp_shard 2, experts split over tp
	}
	for _, ac := range []moe.AC{{Mode: moe.ACSelective}, {Mode: moe.ACNone}, {Mode: moe.ACFull}, {Mode: moe.ACLayer, Every: 2}} {
		trainsAsOneRankAC(t, "tp", cfg, ac, cases)
	}
}

// TestNumericTPRefuses: combinations the numeric backend does not execute
// are refused by name.
func TestNumericTPRefuses(t *testing.T) {
	cfg := tpModel(t)
	for _, tc := range []struct {
		l    moe.Layout
		seq  int
		want string
	}{
		{moe.Layout{GPUs: 2, TP: 2, EP: 2, ETP: 1}, 4, "etp = 1 is not built"},
		{moe.Layout{GPUs: 4, TP: 4}, 4, "seq = 4 is not divisible by tp × 2·cp"},
	} {
		l := tc.l
		l.Sharding, l.ReshardAfterForward = moe.ShardFSDP, true
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		m, err := parallel.NewMesh(l, cfg, 8)
		if err != nil {
			t.Fatal(err)
		}
		init, _ := moe.NewModel[float32](cfg)
		_, err = New(Spec{Config: cfg, Mesh: m, Batch: parallel.Batch{LBS: 1, Seq: tc.seq, Micro: 1, DP: l.DP()}}, init.Tensors())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v seq %d: New = %v, want an error saying %q", tc.l, tc.seq, err, tc.want)
		}
	}
}
