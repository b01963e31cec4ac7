package job

import (
	"math"
	"strings"
	"testing"
)

// TestResolveCP: cp takes the factor between dp_shard and tp, and EP
// borrows from dp_shard·cp·tp, as torchtitan v0.2.2's ParallelDims does
// (73a0e69 torchtitan/distributed/parallel_dims.py: dp_shard = world /
// (dp_replicate·cp·tp·pp), efsdp = dp_shard·cp·tp/(etp·ep)); the defaults
// are v0.2.2's job_config.py (rotate method allgather, load balancer
// headtail). Degrees worked by hand.
func TestResolveCP(t *testing.T) {
	for _, c := range []struct {
		in           Layout
		shard, efsdp int
	}{
		// 64 GPUs, cp 2, tp 2: dp_shard = 64/(2·2) = 16; with ep 1 the
		// experts split over tp (expert tp 2): efsdp = 16·2·2/(1·2) = 32.
		{Layout{GPUs: 64, CP: 2, TP: 2}, 16, 32},
		// 64 GPUs, cp 2, tp 2, ep 8, etp 1: efsdp = 16·2·2/8 = 8.
		{Layout{GPUs: 64, CP: 2, TP: 2, EP: 8}, 16, 8},
		// 16 GPUs, cp 8, 2 replicas: dp_shard = 16/(2·8) = 1, ep 8 borrows
		// the cp ranks: efsdp = 1·8/8 = 1.
		{Layout{GPUs: 16, CP: 8, DPReplicate: 2, EP: 8}, 1, 1},
		// dp_shard given: gpus = 3·4 = 12.
		{Layout{DPShard: 3, CP: 4}, 3, 12},
	} {
		l := c.in
		if err := l.Resolve(); err != nil {
			t.Fatalf("%+v: %v", c.in, err)
		}
		if l.DPShard != c.shard || l.ExpertShard() != c.efsdp || l.CPMethod != CPAllGather || l.CPLoadBalancer != CPHeadTail {
			t.Errorf("%+v resolved to dp_shard %d, efsdp %d, %s, %s; want dp_shard %d, efsdp %d, allgather, headtail",
				c.in, l.DPShard, l.ExpertShard(), l.CPMethod, l.CPLoadBalancer, c.shard, c.efsdp)
		}
		if got := l.StageGPUs(); got != l.GPUs {
			t.Errorf("%+v: stage GPUs %d, want the world %d", c.in, got, l.GPUs)
		}
	}
	// cp = 1 is written as 0: the JSON of a layout without CP is unchanged.
	l := Layout{GPUs: 8, CP: 1}
	if err := l.Resolve(); err != nil || l.CP != 0 {
		t.Errorf("cp 1: %v, cp written %d; want nil, 0", err, l.CP)
	}
}

// TestResolveCPErrors: a contradiction prints every factor; methods not
// modelled and options without cp are refused by name.
func TestResolveCPErrors(t *testing.T) {
	for _, c := range []struct {
		in   Layout
		want []string
	}{
		{Layout{GPUs: 64, CP: 3}, []string{"gpus = 64", "dp_replicate × cp × tp = 1 × 3 × 1 = 3"}},
		{Layout{GPUs: 64, CP: 3, DPShard: 8}, []string{"gpus = 64", "dp_shard × cp × tp = 8 × 3 × 1 = 24"}},
		{Layout{GPUs: 64, CP: 2, DPShard: 8, DPReplicate: 2}, []string{"dp_replicate × dp_shard × cp × tp = 2 × 8 × 2 × 1 ≠ gpus = 64"}},
		{Layout{GPUs: 8, CP: 2, EP: 3}, []string{"ep × etp = 3 × 1", "dp_shard × cp × tp = 4 × 2 × 1 = 8", "cp 2"}},
		{Layout{GPUs: 8, CP: 2, CPMethod: CPA2A}, []string{"cp_method = a2a", "not modelled yet"}},
		{Layout{GPUs: 8, CP: 2, CPMethod: CPA2AP2P}, []string{"cp_method = a2a+p2p", "not modelled yet"}},
		{Layout{GPUs: 8, CP: 2, CPMethod: "ring"}, []string{"cp_method = ring", "allgather, alltoall, p2p"}},
		{Layout{GPUs: 8, CP: 2, CPLoadBalancer: "zigzag"}, []string{"cp_load_balancer = zigzag", "headtail, ptrr or none"}},
		{Layout{GPUs: 8, CPMethod: CPP2P}, []string{"need cp > 1"}},
		{Layout{GPUs: 8, CP: -1}, []string{"cp = -1"}},
	} {
		l := c.in
		err := l.Resolve()
		if err == nil {
			t.Errorf("%+v: resolved; want an error", c.in)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: %v; want it to say %q", c.in, err, w)
			}
		}
	}
}

// TestCheckSeqCP: torchtitan's seq_len_divisor tp·(2·cp) (parallel_dims.py
// v0.2.2); without a load balancer the shards are cp contiguous chunks.
func TestCheckSeqCP(t *testing.T) {
	for _, c := range []struct {
		l   Layout
		seq int
		ok  bool
	}{
		{Layout{GPUs: 8, CP: 2, TP: 2}, 16, true},                       // 16 = 2·2·2·2
		{Layout{GPUs: 8, CP: 2, TP: 2}, 12, false},                      // 12 mod 8 ≠ 0
		{Layout{GPUs: 8, CP: 4}, 24, true},                              // 24 mod 8 = 0
		{Layout{GPUs: 8, CP: 4}, 20, false},                             // 20 mod 8 ≠ 0
		{Layout{GPUs: 8, CP: 4, CPLoadBalancer: CPNoBalance}, 20, true}, // 20 mod 4 = 0
	} {
		l := c.l
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		if err := l.CheckSeq(c.seq); (err == nil) != c.ok {
			t.Errorf("%+v seq %d: %v; want ok %v", c.l, c.seq, err, c.ok)
		}
	}
}

// TestCPAttentionShare: the most loaded rank's share of the causal mask's
// entries, counted by hand. seq 4, cp 2, no balancer: rank 1 holds rows 2
// and 3, which see 3 and 4 keys: 7 of 10 entries. seq 8, cp 4: rank 3
// holds rows 6, 7 (7 + 8 = 15 of 36). Balanced: 1/cp.
func TestCPAttentionShare(t *testing.T) {
	for _, c := range []struct {
		cp, seq int
		lb      CPLoadBalancer
		want    float64
	}{
		{2, 4, CPNoBalance, 7.0 / 10},
		{4, 8, CPNoBalance, 15.0 / 36},
		{4, 8, CPHeadTail, 0.25},
		{4, 8, CPPTRR, 0.25},
		{1, 8, CPNoBalance, 1},
	} {
		l := Layout{CP: c.cp, CPLoadBalancer: c.lb}
		if got := l.CPAttentionShare(c.seq); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("cp %d seq %d %s: share %v, want %v", c.cp, c.seq, c.lb, got, c.want)
		}
	}
}

// TestFoldCP: the folded run has the same tokens per step and the same
// ranks: dp_shard·cp data-parallel ranks of seq/cp tokens.
func TestFoldCP(t *testing.T) {
	s := Spec{Layout: Layout{GPUs: 16, CP: 4, TP: 2}, Batch: Batch{LBS: 2, Seq: 64, GradAccum: 3}}
	if err := s.Layout.Resolve(); err != nil {
		t.Fatal(err)
	}
	f := s.FoldCP()
	if f.DPShard != 8 || f.CPDegree() != 1 || f.Seq != 16 || f.GPUs != 16 || f.LBS != 2 {
		t.Fatalf("folded %+v; want dp_shard 2·4 = 8, cp 1, seq 64/4 = 16 on 16 GPUs", f)
	}
	if err := f.Layout.Validate(); err != nil {
		t.Fatal(err)
	}
	// Global tokens: lbs·dp·ga·seq = 2·2·3·64 = 768 = 2·8·3·16.
	if a, b := s.Global(s.DP())*int64(s.Seq), f.Global(f.DP())*int64(f.Seq); a != 768 || b != 768 {
		t.Errorf("global tokens %d and folded %d, want 768", a, b)
	}
}
