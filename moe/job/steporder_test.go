package job

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
)

// stepString writes o's phases one per line (StepPhase.String).
func stepString(o StepOrder) string {
	var b strings.Builder
	for _, p := range o.Phases() {
		b.WriteString(p.String() + "\n")
	}
	return b.String()
}

// TestStepOrder: the order of one step of a two-block model (units
// embedding −1, blocks 0 and 1, head 2), written out by hand from the
// rules NewStepOrder's doc states (torchtitan's FSDP2 defaults, DESIGN's
// layout contract for keep-gathered, grad-sync-last-only and
// allreduce-last-only, Megatron-FSDP's unit lifetimes).
func TestStepOrder(t *testing.T) {
	cfg := &moe.Config{Layers: 2}
	fsdp := Layout{GPUs: 4, DPShard: 4, DPReplicate: 1, Sharding: ShardFSDP, ReshardAfterForward: true}
	cases := []struct {
		name  string
		edit  func(*Layout, *moe.Config)
		accum int
		want  string
	}{
		{"fsdp2 reshard", func(*Layout, *moe.Config) {}, 1, `0 forward -1 gather free
0 forward 0 gather free
0 forward 1 gather
0 forward 2 gather
0 backward 2 reduce free
0 backward 1 reduce free
0 backward 0 gather reduce free
0 backward -1 gather reduce free
`},
		// A tied embedding stays gathered: the head reads its weights.
		{"tied", func(_ *Layout, c *moe.Config) { c.TiedEmbeddings = true }, 1, `0 forward -1 gather
0 forward 0 gather free
0 forward 1 gather
0 forward 2 gather
0 backward 2 reduce free
0 backward 1 reduce free
0 backward 0 gather reduce free
0 backward -1 reduce free
`},
		// Keep-gathered: the first backward frees nothing, so the second
		// forward gathers only what its own resharding freed.
		{"keep-gathered", func(l *Layout, _ *moe.Config) { l.KeepGathered = true }, 2, `0 forward -1 gather free
0 forward 0 gather free
0 forward 1 gather
0 forward 2 gather
0 backward 2 reduce
0 backward 1 reduce
0 backward 0 gather reduce
0 backward -1 gather reduce
1 forward -1 free
1 forward 0 free
1 forward 1
1 forward 2
1 backward 2 reduce free
1 backward 1 reduce free
1 backward 0 gather reduce free
1 backward -1 gather reduce free
`},
		// Megatron-FSDP frees every block after its forward, the last too;
		// its embedding and output layer stay gathered.
		{"megatron", func(l *Layout, _ *moe.Config) { l.FSDPImpl = FSDPMegatron }, 1, `0 forward -1 gather
0 forward 0 gather free
0 forward 1 gather free
0 forward 2 gather
0 backward 2 reduce
0 backward 1 gather reduce free
0 backward 0 gather reduce free
0 backward -1 reduce
`},
		// Two replicas, both last-only options: one reduction, at the end.
		{"grad-sync and all-reduce last only, no reshard", func(l *Layout, _ *moe.Config) {
			l.ReshardAfterForward, l.DPShard, l.DPReplicate = false, 2, 2
			l.GradSyncLastOnly, l.AllreduceLastOnly = true, true
		}, 2, `0 forward -1 gather
0 forward 0 gather
0 forward 1 gather
0 forward 2 gather
0 backward 2 free
0 backward 1 free
0 backward 0 free
0 backward -1 free
1 forward -1 gather
1 forward 0 gather
1 forward 1 gather
1 forward 2 gather
1 backward 2 reduce replica free
1 backward 1 reduce replica free
1 backward 0 reduce replica free
1 backward -1 reduce replica free
`},
		// ZeRO-1: weights are whole; "gather" is the compute copy a
		// backend makes where compute and storage types differ.
		{"zero1", func(l *Layout, _ *moe.Config) { l.Sharding = ShardZeRO1 }, 1, `0 forward -1 gather
0 forward 0 gather
0 forward 1 gather
0 forward 2 gather
0 backward 2 reduce free
0 backward 1 reduce free
0 backward 0 reduce free
0 backward -1 reduce free
`},
	}
	for _, tc := range cases {
		l, c := fsdp, *cfg
		tc.edit(&l, &c)
		o := NewStepOrder(&c, l, tc.accum)
		if got := stepString(o); got != tc.want {
			t.Errorf("%s:\ngot\n%swant\n%s", tc.name, got, tc.want)
		}
	}
}

// TestStepOrderViews: Forward, Backward and Phase index the same phases
// Phases lists.
func TestStepOrderViews(t *testing.T) {
	cfg := &moe.Config{Layers: 3}
	l := Layout{GPUs: 2, DPShard: 2, DPReplicate: 1, Sharding: ShardFSDP, ReshardAfterForward: true, KeepGathered: true}
	o := NewStepOrder(cfg, l, 3)
	for m := 0; m < 3; m++ {
		for i, p := range o.Forward(m) {
			if p.Pass != StepForward || p.Micro != m || p.Layer != o.Layers[i] || o.Phase(StepForward, m, p.Layer) != p {
				t.Errorf("forward %d unit %d: %v", m, i, p)
			}
		}
		for k, p := range o.Backward(m) {
			if p.Pass != StepBackward || p.Micro != m || p.Layer != o.Layers[len(o.Layers)-1-k] || o.Phase(StepBackward, m, p.Layer) != p {
				t.Errorf("backward %d step %d: %v", m, k, p)
			}
		}
	}
}
