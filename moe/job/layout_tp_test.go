package job

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
)

// TestResolveTP: tensor parallelism takes the innermost factor of the
// world, and EP borrows ranks as torchtitan v0.2.2's ParallelDims does
// (torchtitan/distributed/parallel_dims.py at v0.2.2, 73a0e69: efsdp =
// dp_shard·cp·tp/(etp·ep); etp ∈ {1, tp}). Expected degrees are worked by
// hand from those rules.
func TestResolveTP(t *testing.T) {
	for _, c := range []struct {
		in                            Layout
		shard, rep, etp, expTP, efsdp int
		tokensDiv                     int
	}{
		// 8 GPUs, tp 2: dp_shard = 8/2 = 4; no EP, experts split over tp.
		{Layout{GPUs: 8, TP: 2}, 4, 1, 1, 2, 4, 1},
		// tp 2, ep 4, etp 1: EP borrows dp_shard·tp = 8; efsdp = 8/4 = 2;
		// routed rows split over the 2 tp ranks.
		{Layout{GPUs: 8, TP: 2, EP: 4}, 4, 1, 1, 1, 2, 2},
		// tp 2, ep 2, etp 2: EP borrows dp_shard only; efsdp = 4·2/(2·2) = 2.
		{Layout{GPUs: 8, TP: 2, EP: 2, ETP: 2}, 4, 1, 2, 2, 2, 1},
		// tp 4, ep 8, etp 1 on 16 GPUs with 2 replicas: dp_shard = 16/(2·4) = 2,
		// efsdp = 2·4/8 = 1.
		{Layout{GPUs: 16, TP: 4, EP: 8, DPReplicate: 2}, 2, 2, 1, 1, 1, 4},
		// dp_shard given: gpus = 3·1·2 = 6.
		{Layout{DPShard: 3, TP: 2}, 3, 1, 1, 2, 3, 1},
	} {
		l := c.in
		if err := l.Resolve(); err != nil {
			t.Fatalf("%+v: %v", c.in, err)
		}
		if l.DPShard != c.shard || l.DPReplicate != c.rep || l.ETP != c.etp || l.ExpertTP() != c.expTP ||
			l.ExpertShard() != c.efsdp || l.TokensPerExpertRank() != c.tokensDiv {
			t.Errorf("%+v resolved to %+v: expert tp %d, efsdp %d, token divisor %d; want dp_shard %d, dp_replicate %d, etp %d, expert tp %d, efsdp %d, divisor %d",
				c.in, l, l.ExpertTP(), l.ExpertShard(), l.TokensPerExpertRank(), c.shard, c.rep, c.etp, c.expTP, c.efsdp, c.tokensDiv)
		}
	}
}

// TestResolveTPErrors: each refused layout's error prints every factor
// involved.
func TestResolveTPErrors(t *testing.T) {
	for _, c := range []struct {
		in   Layout
		want []string
	}{
		{Layout{GPUs: 6, TP: 4}, []string{"gpus = 6", "dp_replicate × tp = 1 × 4"}},
		{Layout{GPUs: 8, TP: 2, ETP: 4}, []string{"etp = 4", "must be 1 or tp = 2"}},
		// ep 4 × etp 2 = 8 does not divide dp_shard·tp = 2·2 = 4.
		{Layout{GPUs: 4, TP: 2, EP: 4, ETP: 2}, []string{"ep × etp = 4 × 2", "dp_shard × tp = 2 × 2 = 4", "dp_replicate 1 × dp_shard 2 × tp 2", "etp = 2"}},
		{Layout{GPUs: 8, DPShard: 2, DPReplicate: 2, TP: 3}, []string{"dp_replicate × dp_shard × tp = 2 × 2 × 3 ≠ gpus = 8"}},
		{Layout{GPUs: 8, TP: -1}, []string{"tp = -1", "must be in [1, 1048576]"}},
	} {
		l := c.in
		err := l.Resolve()
		if err == nil {
			t.Fatalf("%+v resolved to %+v, want an error", c.in, l)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: %q lacks %q", c.in, err, w)
			}
		}
	}
}

// TestCheckModelTP: tp must divide the query heads, the KV heads and every
// FFN width it splits; the error names the factor.
func TestCheckModelTP(t *testing.T) {
	base := moe.Config{Hidden: 64, Layers: 2, Heads: 8, KVHeads: 4, HeadDim: 8, Vocab: 100,
		Experts: 8, TopK: 2, ExpertFFN: 24, DenseFFN: 96, MoELayer: []bool{false, true}}
	for _, c := range []struct {
		tp, ep, etp int
		edit        func(*moe.Config)
		want        string // "" = accepted
	}{
		{2, 1, 1, nil, ""},
		{4, 1, 1, nil, ""},
		{8, 1, 1, nil, "tp = 8 does not divide kv_heads = 4"},
		{3, 1, 1, nil, "tp = 3 does not divide heads = 8"},
		{2, 1, 1, func(c *moe.Config) { c.DenseFFN = 97 }, "tp = 2 does not divide dense_ffn = 97"},
		// ep = 1: experts split over tp; 24 % 16 ≠ 0 is never reached, 24 % 4 = 0.
		{4, 1, 1, func(c *moe.Config) { c.ExpertFFN = 26 }, "expert tensor-parallel degree 4 (tp = 4, etp = 1, ep = 1) does not divide expert_ffn = 26"},
		// ep 2, etp 1: experts whole, any width.
		{4, 2, 1, func(c *moe.Config) { c.ExpertFFN = 26 }, ""},
		{2, 2, 2, func(c *moe.Config) { c.ExpertFFN = 25 }, "expert tensor-parallel degree 2"},
		{2, 1, 1, func(c *moe.Config) { c.SharedExperts, c.SharedFFN = 1, 33 }, "tp = 2 does not divide shared_experts × shared_ffn = 33"},
		{2, 1, 1, func(c *moe.Config) { c.QKNorm = moe.QKNormFull }, "qk_norm full"},
	} {
		cfg := base
		cfg.MoELayer = append([]bool(nil), base.MoELayer...)
		if c.edit != nil {
			c.edit(&cfg)
		}
		l := Layout{GPUs: 8 * c.tp, TP: c.tp, EP: c.ep, ETP: c.etp}
		if err := l.Resolve(); err != nil {
			t.Fatalf("tp %d ep %d etp %d: %v", c.tp, c.ep, c.etp, err)
		}
		err := l.CheckModel(&cfg)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("tp %d ep %d etp %d: %v, want accepted", c.tp, c.ep, c.etp, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("tp %d ep %d etp %d: %v, want %q", c.tp, c.ep, c.etp, err, c.want)
		}
	}
}

// TestCheckSeqTP: torchtitan v0.2.2 asserts seq_len % (tp·2·cp) == 0 when
// it applies TP (models/qwen3/infra/parallelize.py, parallelize_qwen3).
func TestCheckSeqTP(t *testing.T) {
	l := Layout{GPUs: 4, TP: 4}
	if err := l.CheckSeq(4096); err != nil {
		t.Error(err)
	}
	if err := l.CheckSeq(4100); err == nil || !strings.Contains(err.Error(), "tp × 2·cp = 4 × 2·1 = 8") {
		t.Errorf("seq 4100, tp 4: %v", err)
	}
	if err := (Layout{GPUs: 1}).CheckSeq(7); err != nil {
		t.Errorf("tp 1 refused an odd seq: %v", err)
	}
}
