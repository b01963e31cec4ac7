package cost

import (
	"math"
	"testing"

	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
)

func mustCluster(t testing.TB, name string) *hw.Cluster {
	t.Helper()
	c, err := hw.LoadCluster(name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func near(a, b, rel float64) bool { return math.Abs(a-b) <= rel*math.Max(math.Abs(a), math.Abs(b)) }

// Hand-worked collective times on the built-in clusters. hgx (B200):
// B_nv = 0.8 × 900e9 = 720e9 B/s; B_net = 0.9 × 8 × 400e9/8 / 8 = 45e9 B/s per
// GPU; latencies base 8.4 µs, NVLink 3.4 µs/step, network 14 µs/step.
func TestCollectiveCostHandWorked(t *testing.T) {
	hgx := mustCluster(t, "hgx")
	nvl := mustCluster(t, "gb200-nvl72")
	cases := []struct {
		name  string
		c     *hw.Cluster
		kind  parallel.CollKind
		g     GroupShape
		bytes float64
		algo  string
		link  hw.LinkClass
		want  float64 // seconds
	}{
		// 8 ranks in one host: (7/8)·8e9 / 720e9 = 9.72222 ms; latency 8.4 + 7·3.4 = 32.2 µs.
		{"ag-intra", hgx, parallel.CollAllGather, GroupShape{8, 1, 8}, 8e9, "ring", hw.LinkNVLink, 7e9/720e9 + 32.2e-6},
		// reduce-scatter is the same volume and steps.
		{"rs-intra", hgx, parallel.CollReduceScatter, GroupShape{8, 1, 8}, 8e9, "ring", hw.LinkNVLink, 7e9/720e9 + 32.2e-6},
		// All-reduce 16 ranks on 2 hosts, 1e9 bytes.
		//  ring: 2·15/16·1e9 / min(720e9, 8·45e9) = 5.20833 ms, latency 8.4 + 28·3.4 + 2·14 = 131.6 µs → 5.33993 ms
		//  hierarchical: 1.75e9/720e9 + (1e9/8)/45e9 = 2.43056 + 2.77778 ms, latency 2·8.4 + 14·3.4 + 2·14 = 92.4 µs → 5.30073 ms
		//  tree: 1e9/(0.46·360e9) = 6.03865 ms + latency → slower. Hierarchical wins.
		{"ar-2hosts", hgx, parallel.CollAllReduce, GroupShape{16, 2, 8}, 1e9, "hierarchical", hw.LinkNet, 1.75e9/720e9 + 0.125e9/45e9 + 92.4e-6},
		// Replica all-reduce across 4 hosts, one rank each: ring 1.5e9/45e9 = 33.3333 ms, latency 8.4 + 6·14 = 92.4 µs.
		{"ar-strided", hgx, parallel.CollAllReduce, GroupShape{4, 4, 1}, 1e9, "ring", hw.LinkNet, 1.5e9/45e9 + 92.4e-6},
		// All-to-all 16 ranks, 2 hosts, 1.6e9 bytes sent per rank: intra 7/16·1.6e9 = 0.7e9 over NVLink (0.97 ms),
		// inter 8/16·1.6e9 = 0.8e9 over the own NIC = 17.7778 ms; latency 8.4 + 14 = 22.4 µs.
		{"a2a-2hosts", hgx, parallel.CollAllToAll, GroupShape{16, 2, 8}, 1.6e9, "direct", hw.LinkNet, 0.8e9/45e9 + 22.4e-6},
		// NVL72: 64 ranks on 16 hosts but one NVLink domain: NVLink ring, 63e9/720e9 = 87.5 ms; latency 8.4 + 63·3.4 = 222.6 µs.
		{"ag-nvl72", nvl, parallel.CollAllGather, GroupShape{64, 1, 64}, 64e9, "ring", hw.LinkNVLink, 63e9/720e9 + 222.6e-6},
		{"one-rank", hgx, parallel.CollAllGather, GroupShape{1, 1, 1}, 1e9, "none", hw.LinkNVLink, 0},
	}
	for _, tc := range cases {
		got, err := Collective(tc.c, nil, tc.kind, tc.g, tc.bytes)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got.Algorithm != tc.algo || got.Link != tc.link || !near(got.Seconds(), tc.want, 1e-9) {
			t.Errorf("%s: got %s on %s, %.9g s; want %s on %s, %.9g s", tc.name, got.Algorithm, got.Link, got.Seconds(), tc.algo, tc.link, tc.want)
		}
	}
}

func TestShapeOf(t *testing.T) {
	hgx := mustCluster(t, "hgx")
	if g := ShapeOf(hgx, []int{0, 8, 16, 24}); g != (GroupShape{4, 4, 1}) {
		t.Errorf("strided: %+v", g)
	}
	if g := ShapeOf(hgx, []int{8, 9, 10, 11, 12, 13, 14, 15, 16, 17}); g != (GroupShape{10, 2, 8}) {
		t.Errorf("straddling: %+v", g)
	}
	nvl := mustCluster(t, "gb200-nvl72")
	r := make([]int, 144)
	for i := range r {
		r[i] = i
	}
	if g := ShapeOf(nvl, r); g != (GroupShape{144, 2, 72}) {
		t.Errorf("nvl72: %+v", g)
	}
}

func TestCollectiveCostBadInput(t *testing.T) {
	hgx := mustCluster(t, "hgx")
	if _, err := Collective(hgx, nil, parallel.CollAllGather, GroupShape{0, 1, 1}, 1); err == nil {
		t.Error("zero ranks accepted")
	}
	if _, err := Collective(hgx, nil, parallel.CollAllGather, GroupShape{2, 1, 2}, math.NaN()); err == nil {
		t.Error("NaN bytes accepted")
	}
}

func TestCollectiveCostRejectsUnmodelledKinds(t *testing.T) {
	c, err := hw.LoadCluster("hgx")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []parallel.CollKind{parallel.CollBroadcast, parallel.CollBarrier, "gossip"} {
		if _, err := Collective(c, nil, k, GroupShape{Ranks: 8, Domains: 1, PerDomain: 8}, 1<<20); err == nil {
			t.Errorf("%s priced, want an error", k)
		}
	}
}
