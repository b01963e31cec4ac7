package parallel

import (
	"reflect"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
)

func TestMeshGroups(t *testing.T) {
	// 8 ranks = dp_replicate 2 × dp_shard 4, ep 2, efsdp 2, 4 GPUs per node.
	// Rank r: replica r/4, shard s = r%4, efsdp s/2, ep s%2 (hand-derived).
	m, err := NewMesh(moetest.FSDPLayout(t, 8, 2, 2), nil, 4)
	if err != nil {
		t.Fatal(err)
	}
	c := m.Coord(6)
	if want := (Coord{Rank: 6, Replica: 1, Shard: 2, EFSDP: 1, EP: 0, Node: 1, Local: 2}); c != want {
		t.Fatalf("Coord(6) = %+v, want %+v", c, want)
	}
	cases := []struct {
		axis  Axis
		rank  int
		ranks []int
	}{
		{AxisReplicate, 6, []int{2, 6}},
		{AxisShard, 6, []int{4, 5, 6, 7}},
		{AxisEP, 6, []int{6, 7}},
		{AxisEFSDP, 6, []int{4, 6}},
		{AxisEFSDP, 1, []int{1, 3}},
		{AxisDP, 3, []int{0, 1, 2, 3, 4, 5, 6, 7}},
	}
	for _, tc := range cases {
		if g := m.Group(tc.axis, tc.rank); !reflect.DeepEqual(g.Ranks, tc.ranks) {
			t.Errorf("Group(%s, %d) = %v, want %v", tc.axis, tc.rank, g.Ranks, tc.ranks)
		}
	}
	checkPartitions(t, "", m, 8)
}

// checkPartitions: every axis's groups partition the world's ranks, and
// Group finds each rank's own group.
func checkPartitions(t *testing.T, name string, m *Mesh, world int) {
	t.Helper()
	for _, a := range MeshAxes() {
		seen := map[int]int{}
		for _, g := range m.Groups(a) {
			for _, r := range g.Ranks {
				seen[r]++
				if got := m.Group(a, r); got.Index != g.Index {
					t.Errorf("%s %s: rank %d in group %d but Group says %d", name, a, r, g.Index, got.Index)
				}
			}
		}
		if len(seen) != world {
			t.Errorf("%s %s: groups cover %d ranks, want %d", name, a, len(seen), world)
		}
		for r, n := range seen {
			if n != 1 {
				t.Errorf("%s %s: rank %d in %d groups", name, a, r, n)
			}
		}
	}
}

func TestMeshErrors(t *testing.T) {
	cfg := &moe.Config{Experts: 6, MoELayer: []bool{true}}
	l := moetest.FSDPLayout(t, 8, 1, 4)
	_, err := NewMesh(l, cfg, 8)
	if err == nil || !strings.Contains(err.Error(), "experts = 6") || !strings.Contains(err.Error(), "efsdp 2 × ep 4") {
		t.Errorf("ep ∤ experts: err = %v", err)
	}
	_, err = NewMesh(moetest.FSDPLayout(t, 12, 1, 1), nil, 8)
	if err == nil || !strings.Contains(err.Error(), "gpus_per_node = 8 does not divide gpus = 12") {
		t.Errorf("gpn ∤ gpus: err = %v", err)
	}
	bad := job.Layout{GPUs: 8, DPShard: 4, DPReplicate: 2, EP: 3, Sharding: job.ShardFSDP}
	if _, err := NewMesh(bad, nil, 8); err == nil || !strings.Contains(err.Error(), "ep = 3 does not divide dp_shard = 4") {
		t.Errorf("ep ∤ dp_shard: err = %v", err)
	}
	if _, err := NewMesh(moetest.FSDPLayout(t, 2, 1, 1), nil, 0); err == nil || !strings.Contains(err.Error(), "gpus_per_node") {
		t.Errorf("gpn 0: err = %v", err)
	}
}

func TestExpertShardDim(t *testing.T) {
	// efsdp·ep = 4·2 = 8: dim 0 for 8 experts, dim 1 for 4 (would pad).
	m, _ := NewMesh(moetest.FSDPLayout(t, 8, 1, 2), nil, 8)
	if d := m.ExpertShardDim(8); d != 0 {
		t.Errorf("8 experts: dim %d, want 0", d)
	}
	if d := m.ExpertShardDim(4); d != 1 {
		t.Errorf("4 experts: dim %d, want 1", d)
	}
}

// TestMeshGroupsTP: tp innermost, and the expert mesh as torchtitan v0.2.2
// unflattens dp_shard × tp into (efsdp, ep, etp). Hand-derived for rank 11
// of 16 = dp_replicate 2 × dp_shard 4 × tp 2: t = 11 mod 2 = 1, d = 5,
// replica 1, shard 1, position in the replica's dp_shard × tp = 1·2 + 1 = 3.
func TestMeshGroupsTP(t *testing.T) {
	for _, c := range []struct {
		name   string
		l      job.Layout
		groups map[Axis][]int
	}{
		// etp 1, ep 4: EP borrows the tp ranks; efsdp = 4·2/4 = 2;
		// position 3 = f 0 · 4 + e 3.
		{"etp 1", job.Layout{GPUs: 16, DPReplicate: 2, TP: 2, EP: 4, ETP: 1}, map[Axis][]int{
			AxisTP: {10, 11}, AxisShard: {9, 11, 13, 15}, AxisReplicate: {3, 11},
			AxisEP: {8, 9, 10, 11}, AxisEFSDP: {11, 15},
		}},
		// etp = tp = 2, ep 2: EP borrows dp_shard only; efsdp = 4·2/(2·2)
		// = 2; position 3 = (f 0 · 2 + e 1) · 2 + j 1.
		{"etp tp", job.Layout{GPUs: 16, DPReplicate: 2, TP: 2, EP: 2, ETP: 2}, map[Axis][]int{
			AxisTP: {10, 11}, AxisShard: {9, 11, 13, 15}, AxisReplicate: {3, 11},
			AxisEP: {9, 11}, AxisEFSDP: {11, 15},
		}},
	} {
		l := c.l
		l.Sharding = job.ShardFSDP
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		m, err := NewMesh(l, nil, 8)
		if err != nil {
			t.Fatal(err)
		}
		if co := m.Coord(11); co.TP != 1 || co.Shard != 1 || co.Replica != 1 || co.DPRank(l) != 5 {
			t.Errorf("%s: Coord(11) = %+v, DP rank %d; want tp 1, shard 1, replica 1, DP rank 5", c.name, co, co.DPRank(l))
		}
		for a, want := range c.groups {
			if g := m.Group(a, 11); !reflect.DeepEqual(g.Ranks, want) {
				t.Errorf("%s: Group(%s, 11) = %v, want %v", c.name, a, g.Ranks, want)
			}
		}
		checkPartitions(t, c.name, m, 16)
	}
}
