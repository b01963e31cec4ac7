package sim

import (
	"math"
	"testing"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

func cpInput(t *testing.T, l job.Layout, seq int) Input {
	t.Helper()
	cfg, err := hf.Load("llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	l.Sharding, l.ReshardAfterForward = job.ShardFSDP, true
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	dev, err := hw.LookupDevice("h100")
	if err != nil {
		t.Fatal(err)
	}
	return Input{Spec: job.Spec{Model: cfg, Layout: l, AC: moe.AC{Mode: moe.ACSelective}, Batch: job.Batch{LBS: 1, Seq: seq}, Recipe: job.DefaultRecipe()},
		Device: dev, SkipInterval: true}
}

// TestCPOps: a cp rank's op records are the folded run's (dp_shard·cp,
// seq/cp) but for attention, whose count is the rank's share of the whole
// sequence's causal mask plus the flash tiles' waste on its own diagonal
// blocks. Llama 3 8B, seq 8192, cp 4 (m = 2048 tokens a rank), counted by
// hand: flops' hardware count at 128×128 tiles charges each causal row
// 127/2 entries of diagonal-tile waste, so the folded run's mask is
// 2048·2049/2 + 2048·127/2 = 2228224 entries. With a load balancer the
// rank computes 8192·8193/2/4 = 8389632 entries and the same waste
// (130048); without one the last rank's rows see 2048·3·2048 +
// 2048·2049/2 = 14681088 entries plus the waste. Every pass scales alike;
// every other record is the folded run's, exactly.
func TestCPOps(t *testing.T) {
	for _, c := range []struct {
		lb    job.CPLoadBalancer
		ratio float64
	}{
		{job.CPHeadTail, (8389632.0 + 130048) / 2228224},
		{job.CPNoBalance, (14681088.0 + 130048) / 2228224},
	} {
		in := cpInput(t, job.Layout{GPUs: 8, CP: 4, CPLoadBalancer: c.lb}, 8192)
		folded := in.Spec.FoldCP()
		got, err := cpOps(in.Spec, folded)
		if err != nil {
			t.Fatal(err)
		}
		want, err := tpOps(folded.Model, folded.Layout, flops.Shape{Seq: folded.Seq, Batch: folded.LBS}, folded.AC)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("%d records, folded run %d", len(got), len(want))
		}
		attn := 0
		for i := range got {
			if got[i].Op != moe.OpAttn {
				if got[i] != want[i] {
					t.Errorf("%s: record %d = %+v, folded run's %+v", c.lb, i, got[i], want[i])
				}
				continue
			}
			attn++
			if r := float64(got[i].Count) / float64(want[i].Count); math.Abs(r/c.ratio-1) > 1e-6 {
				t.Errorf("%s: %s layer %d: attention %d = %.6f × the folded run's, want %.6f", c.lb, got[i].Pass, got[i].Layer, got[i].Count, r, c.ratio)
			}
		}
		if attn == 0 {
			t.Fatal("no attention records")
		}
	}
}

// TestSimulateCP: the breakdown names each method's collectives; a ring
// fully hidden by long attention exposes nothing, and the exchange shows
// in comm_s; a rank's tokens are seq/cp per sequence (torchtitan's TPS
// divides by cp); the K/V groups of cp 4 × tp 2 ranks (0, 2, 4, 6) lie in
// one 8-GPU NVLink domain, those of cp 8 × tp 2 span two.
func TestSimulateCP(t *testing.T) {
	for _, c := range []struct {
		l     job.Layout
		names []string
		link  string
	}{
		{job.Layout{GPUs: 16, CP: 4, TP: 2}, []string{"cp_all_gather_kv", "cp_reduce_scatter_dkv"}, "nvlink"},
		{job.Layout{GPUs: 16, CP: 4, TP: 2, CPMethod: job.CPP2P}, []string{"cp_ring_kv", "cp_ring_dkv"}, "nvlink"},
		{job.Layout{GPUs: 16, CP: 8, TP: 2, CPMethod: job.CPP2P}, []string{"cp_ring_kv", "cp_ring_dkv"}, "network"},
	} {
		in := cpInput(t, c.l, 65536)
		res, err := Simulate(in)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range c.names {
			if !(res.Breakdown.CommS[n] > 0) {
				t.Errorf("%s: comm_s[%s] = %v, want > 0 (%v)", c.l.Label(), n, res.Breakdown.CommS[n], res.Breakdown.CommS)
			}
		}
		if res.CPLink != c.link {
			t.Errorf("%s: cp link %s, want %s", c.l.Label(), res.CPLink, c.link)
		}
		// tokens per rank per step: lbs·seq/cp/tp.
		tokens := 65536.0 / float64(c.l.CP) / 2
		if got := res.TPS * res.StepTimeS; math.Abs(got/tokens-1) > 1e-9 {
			t.Errorf("%s: TPS × step time = %v tokens, want %v", c.l.Label(), got, tokens)
		}
	}
}

// TestCPExchangeHidden: a ring hop hidden behind its attention block
// exposes nothing and one longer than the block exposes the difference per
// hop; the last dK/dV hop of backward is always exposed.
func TestCPExchangeHidden(t *testing.T) {
	cl, err := hw.LoadCluster("hgx")
	if err != nil {
		t.Fatal(err)
	}
	x := cpExchange{cp: 4, method: job.CPP2P, cl: cl, link: hw.LinkNVLink, shard: 1 << 20}
	f, err := x.forward(nil, 1e3)
	if err != nil {
		t.Fatal(err)
	}
	if f.exposed[cpRingKV] != 0 || !(f.total[cpRingKV] > 0) {
		t.Errorf("long attention: ring exposed %v of %v, want 0 of > 0", f.exposed[cpRingKV], f.total[cpRingKV])
	}
	f0, _ := x.forward(nil, 0)
	if f0.exposed[cpRingKV] != f0.total[cpRingKV] {
		t.Errorf("no attention: ring exposed %v of %v, want all", f0.exposed[cpRingKV], f0.total[cpRingKV])
	}
	b, _ := x.backward(nil, 1e3)
	if hop := b.total[cpRingDKV] / 4; math.Abs(b.exposed[cpRingDKV]-hop) > 1e-15 || b.exposed[cpRingKV] != 0 {
		t.Errorf("long attention backward: exposed kv %v, dkv %v; want 0 and one hop %v", b.exposed[cpRingKV], b.exposed[cpRingDKV], hop)
	}
}
