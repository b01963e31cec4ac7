package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// Schedules whose answers are known by construction.
func TestEngineOverlap(t *testing.T) {
	cases := []struct {
		name string
		ops  []simOp
		want []simSpan
	}{
		{
			// Compute A (1 s) overlaps a 2 s gather; B needs the gather: starts at 2, ends at 3.
			"prefetch", []simOp{
				{stream: simCompute, compute: 1},
				{stream: simGather, coll: true, work: 2},
				{stream: simCompute, compute: 1, deps: []int{1}},
			},
			[]simSpan{{0, 1}, {0, 2}, {2, 3}},
		},
		{
			// Two transfers of 1 s and 3 s on one link from two streams share it: 2 s and 4 s.
			"shared-link", []simOp{
				{stream: simGather, coll: true, work: 1, link: hw.LinkNVLink},
				{stream: simReduce, coll: true, work: 3, link: hw.LinkNVLink},
			},
			[]simSpan{{0, 2}, {0, 4}},
		},
		{
			// On different links they do not interfere.
			"two-links", []simOp{
				{stream: simGather, coll: true, work: 1, link: hw.LinkNVLink},
				{stream: simReduce, coll: true, work: 3, link: hw.LinkNet},
			},
			[]simSpan{{0, 1}, {0, 3}},
		},
		{
			// Latency is not shared: the gather waits 0.5 s, meanwhile the
			// reduce moves 0.5 s of its 1 s alone; then both share: the reduce
			// ends at 0.5 + 2·0.5 = 1.5, the gather has 0.5 left at 1.5 → 2.0.
			"latency", []simOp{
				{stream: simGather, coll: true, lat: 0.5, work: 1},
				{stream: simReduce, coll: true, work: 1},
			},
			[]simSpan{{0, 2}, {0, 1.5}},
		},
		{
			// Stream order: the second gather waits for the first even with no deps.
			"stream-order", []simOp{
				{stream: simGather, coll: true, work: 1},
				{stream: simGather, coll: true, work: 1},
				{stream: simCompute, compute: 0.5, deps: []int{1}},
			},
			[]simSpan{{0, 1}, {1, 2}, {2, 2.5}},
		},
	}
	for _, tc := range cases {
		got, err := runEngine(tc.ops)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for i := range got {
			if !near(got[i].start, tc.want[i].start, 1e-12) && !(got[i].start == 0 && tc.want[i].start == 0) ||
				!near(got[i].end, tc.want[i].end, 1e-12) {
				t.Errorf("%s: op %d ran %v, want %v", tc.name, i, got[i], tc.want[i])
			}
		}
	}
}

func TestEngineDeadlock(t *testing.T) {
	ops := []simOp{
		{stream: simCompute, compute: 1, deps: []int{1}},
		{stream: simCompute, compute: 1},
	}
	if _, err := runEngine(ops); err == nil || !strings.Contains(err.Error(), "deadlock") {
		t.Errorf("want deadlock error, got %v", err)
	}
}

// The breakdown charges idle compute time to the collectives in flight, in
// proportion to their overlap with the idle gap: compute A (1 s) overlaps a
// 3 s gather and, from t = 1, a 1 s all-reduce; B waits for the gather
// until t = 3. The 2 s gap [1, 3] sees the gather for 2 s and the
// all-reduce for 1 s: 4/3 s gather, 2/3 s all-reduce.
func TestBreakdownAttribution(t *testing.T) {
	sched := &parallel.Schedule{Ops: []parallel.ScheduleOp{
		{Type: parallel.OpCompute, Phase: parallel.PhaseForward},
		{Type: parallel.OpCollective, Coll: parallel.CollAllGather},
		{Type: parallel.OpCollective, Coll: parallel.CollAllReduce},
		{Type: parallel.OpCompute, Phase: parallel.PhaseBackward},
	}}
	sim := &simulated{
		ops: []simOp{
			{stream: simCompute, compute: 1},
			{stream: simGather, coll: true, work: 3, link: hw.LinkNVLink},
			{stream: simReduce, coll: true, work: 1, link: hw.LinkNet, deps: []int{0}},
			{stream: simCompute, compute: 1, deps: []int{1}},
		},
		recompute: make([]float64, 4),
		comm:      []cost.Comm{{}, {Kind: parallel.CollAllGather}, {Kind: parallel.CollAllReduce}, {}},
	}
	spans, err := runEngine(sim.ops)
	if err != nil {
		t.Fatal(err)
	}
	b, bottleneck := breakdown(sched, sim, spans, 4)
	if !near(b.ComputeS, 2, 1e-12) || !near(b.ExposedCommS["all_gather"], 4.0/3, 1e-12) || !near(b.ExposedCommS["all_reduce"], 2.0/3, 1e-12) {
		t.Errorf("breakdown %+v", b)
	}
	if bottleneck != "compute" {
		t.Errorf("bottleneck %q", bottleneck)
	}
}

// A step dominated by a gather names it with its axis and link class.
func TestBottleneckNamesAxisAndLink(t *testing.T) {
	sched := &parallel.Schedule{Ops: []parallel.ScheduleOp{
		{Type: parallel.OpCollective, Coll: parallel.CollAllGather, Axis: parallel.AxisEFSDP},
		{Type: parallel.OpCompute, Phase: parallel.PhaseForward},
	}}
	sim := &simulated{
		ops: []simOp{
			{stream: simGather, coll: true, work: 3, link: hw.LinkNet},
			{stream: simCompute, compute: 1, deps: []int{0}},
		},
		recompute: make([]float64, 2),
		comm:      []cost.Comm{{Kind: parallel.CollAllGather, Link: hw.LinkNet}, {}},
	}
	spans, err := runEngine(sim.ops)
	if err != nil {
		t.Fatal(err)
	}
	b, name := breakdown(sched, sim, spans, 4)
	if name != "exposed all_gather (efsdp, network)" || !near(b.ExposedCommS["all_gather"], 3, 1e-12) {
		t.Errorf("bottleneck %q, breakdown %+v", name, b)
	}
}

// TestEngineTinyFlowLateInStep: a collective whose bandwidth work is below
// half an ulp of the clock cannot move it (float64), so it must end where
// it starts instead of being retried forever. At t = 100 s the ulp is
// 2^-46 s ≈ 1.42e-14 s; a work of 1.5e-15 s rounds away. (Simulate hung on
// 16384 GPUs, whose step passes 16 s, where the ulp exceeds twice the
// old absolute 1e-15 s threshold.)
func TestEngineTinyFlowLateInStep(t *testing.T) {
	ops := []simOp{
		{stream: simCompute, compute: 100},
		{stream: simGather, coll: true, work: 1.5e-15, deps: []int{0}},
		{stream: simCompute, compute: 1, deps: []int{1}},
	}
	done := make(chan struct{})
	var spans []simSpan
	var err error
	go func() {
		spans, err = runEngine(ops)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("runEngine did not return: a flow too small to advance the clock was retried forever")
	}
	if err != nil {
		t.Fatal(err)
	}
	want := []simSpan{{0, 100}, {100, 100}, {100, 101}}
	for i := range want {
		if spans[i] != want[i] {
			t.Errorf("op %d: %+v, want %+v", i, spans[i], want[i])
		}
	}
}
