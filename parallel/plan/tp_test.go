package plan

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// TestEnumerateTP: with tensor-parallel degrees to search, the families at
// 16 GPUs (8 per host, 8 experts) are valid layouts whose tp lies in a
// host, and include the ones derived by hand: tp 2 leaves dp = 8; with
// r = 1, s = 8, EP borrows dp_shard·tp = 16 under etp 1 (ep 1, 2, 4, 8:
// the divisors of 16 that divide the experts) and dp_shard·tp/etp = 8 under
// etp 2 (ep 2, 4, 8; ep 1 has no etp).
func TestEnumerateTP(t *testing.T) {
	q, err := (&Request{GPUs: 16, GPUsPerNode: 8, Experts: 8, MemoryTarget: 0.92, TPs: []int{1, 2, 4, 16},
		ACs: []moe.AC{{Mode: moe.ACFull}}, Shardings: []job.Sharding{job.ShardFSDP}}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	type key struct{ tp, etp, ep, s, r int }
	seen := map[key]bool{}
	for _, f := range q.enumerateFamilies(16, false) {
		l := f.layout
		if err := l.Validate(); err != nil {
			t.Errorf("%+v: %v", l, err)
		}
		if l.TPDegree() > 8 {
			t.Errorf("%+v: tp beyond a host", l)
		}
		seen[key{l.TPDegree(), max(l.ETP, 1), l.EP, l.DPShard, l.DPReplicate}] = true
	}
	for _, k := range []key{
		{2, 1, 1, 8, 1}, {2, 1, 2, 8, 1}, {2, 1, 4, 8, 1}, {2, 1, 8, 8, 1},
		{2, 2, 2, 8, 1}, {2, 2, 4, 8, 1}, {2, 2, 8, 8, 1},
		{4, 1, 8, 2, 2}, {1, 1, 8, 16, 1},
	} {
		if !seen[k] {
			t.Errorf("family tp %d etp %d ep %d dp_shard %d dp_replicate %d missing", k.tp, k.etp, k.ep, k.s, k.r)
		}
	}
	for _, k := range []key{{2, 2, 1, 8, 1}, {2, 2, 16, 8, 1}, {16, 1, 1, 1, 1}} {
		if seen[k] {
			t.Errorf("family tp %d etp %d ep %d dp_shard %d dp_replicate %d should not be searched", k.tp, k.etp, k.ep, k.s, k.r)
		}
	}
	if _, err := (&Request{GPUs: 16, MemoryTarget: 0.92, TPs: []int{0}}).withDefaults(); err == nil {
		t.Error("tp 0 accepted")
	}
}
