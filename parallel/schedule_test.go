package parallel

import (
	"reflect"
	"strings"
	"testing"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"

	"github.com/moescope/moescope/moe"
)

func schedFor(t *testing.T, cfg *moe.Config, l job.Layout, ac moe.AC, micro int) *Schedule {
	t.Helper()
	m, err := NewMesh(l, cfg, 8)
	if err != nil {
		t.Fatal(err)
	}
	s, err := BuildSchedule(ScheduleSpec{Spec: job.Spec{Model: cfg, AC: ac, Batch: job.Batch{LBS: 2, Seq: 4, GradAccum: micro}, Recipe: job.EagerRecipe()}, Mesh: m})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func countColl(s *Schedule) map[Purpose]int {
	n := map[Purpose]int{}
	for _, o := range s.Ops {
		if o.Type == OpCollective {
			n[o.Purpose]++
		}
	}
	return n
}

func TestScheduleCollectiveCounts(t *testing.T) {
	cfg := moetest.TinyMoE()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// 4 ranks, dp_shard 4, ep 2 (efsdp 2): 6 units (embed, L0 dense, L0
	// experts, L1 dense, L1 experts, head). Forward gathers all 6; backward
	// re-gathers all but the last block's two units and the head (kept after
	// forward) = 3; one gradient
	// reduce-scatter per unit = 6; per MoE layer one count exchange and four
	// token all-to-alls (dispatch, combine, and their gradients) = 5 × 2;
	// one loss all-reduce.
	l := moetest.FSDPLayout(t, 4, 1, 2)
	s := schedFor(t, cfg, l, moe.AC{Mode: moe.ACNone}, 1)
	got := countColl(s)
	want := map[Purpose]int{PurposeGather: 9, PurposeGradReduce: 6, PurposeCounts: 2, PurposeDispatch: 2, PurposeCombine: 2,
		PurposeDispatchBwd: 2, PurposeCombineBwd: 2, PurposeLoss: 1}
	for p, n := range want {
		if got[p] != n {
			t.Errorf("%s: %d collectives, want %d", p, got[p], n)
		}
	}
	// Full AC re-runs each block's forward: two more token all-to-alls and
	// one count exchange per MoE layer (REFERENCES: six all-to-alls under full).
	s = schedFor(t, cfg, l, moe.AC{Mode: moe.ACFull}, 1)
	got = countColl(s)
	if a := got[PurposeDispatch] + got[PurposeCombine] + got[PurposeDispatchBwd] + got[PurposeCombineBwd]; a != 12 {
		t.Errorf("full AC: %d token all-to-alls, want 12", a)
	}
	// Megatron's moe module re-runs each MoE layer's forward, its count
	// exchange and dispatch and combine included (CheckpointFunction over
	// MoELayer.forward, Megatron-LM d98e8a6 moe_layer.py): as many
	// all-to-alls as full AC, 12 token and 4 count exchanges, the same 9
	// gathers (the recompute gathers the experts the backward would), and
	// per MoE layer three recompute segments, router, experts, combine.
	s = schedFor(t, cfg, l, moe.AC{Mode: moe.ACModules, Modules: moe.RecomputeMoE}, 1)
	got = countColl(s)
	if a := got[PurposeDispatch] + got[PurposeCombine] + got[PurposeDispatchBwd] + got[PurposeCombineBwd]; a != 12 || got[PurposeCounts] != 4 || got[PurposeGather] != 9 {
		t.Errorf("modules:moe: %d token all-to-alls (want 12), %d count exchanges (want 4), %d gathers (want 9)", a, got[PurposeCounts], got[PurposeGather])
	}
	var rec []Segment
	for _, o := range s.Ops {
		if o.Type == OpCompute && o.Phase == PhaseRecompute {
			rec = append(rec, o.Segment)
		}
	}
	if want := []Segment{SegPre, SegExperts, SegPost, SegPre, SegExperts, SegPost}; !reflect.DeepEqual(rec, want) {
		t.Errorf("modules:moe: recompute segments %v, want %v", rec, want)
	}
	// HSDP 2×2 (ep 1, so efsdp = dp_shard = 2 and expert units are sharded
	// too), grad-accum 3, allreduce-last-only: reduce-scatters every
	// micro-step, 6 units × 3 = 18; replica all-reduces only in the last, 6.
	l = moetest.FSDPLayout(t, 4, 2, 1)
	l.AllreduceLastOnly = true
	s = schedFor(t, cfg, l, moe.AC{Mode: moe.ACSelective}, 3)
	got = countColl(s)
	if got[PurposeGradReduce] != 18 || got[PurposeGradReplica] != 6 {
		t.Errorf("HSDP last-only: reduce-scatter %d (want 18), replica %d (want 6)", got[PurposeGradReduce], got[PurposeGradReplica])
	}
	// Keep-gathered holds weights from backward into the next micro-step's
	// forward (which then gathers nothing); reshard-after-forward still
	// frees them after that forward, so backward re-gathers 3 units:
	// 9 + 2 × 3 = 15 gathers (without keep-gathered: 3 × 9 = 27).
	l.AllreduceLastOnly = false
	l.KeepGathered = true
	s = schedFor(t, cfg, l, moe.AC{Mode: moe.ACNone}, 3)
	if g := countColl(s)[PurposeGather]; g != 15 {
		t.Errorf("keep-gathered: %d gathers, want 15", g)
	}
}

func TestScheduleBytes(t *testing.T) {
	cfg := moetest.TinyMoE()
	// dp_shard 2, ep 2 ⇒ efsdp 1: experts are not gathered. Dense unit of a
	// layer (D=8, q=H·d=8, kv=G·d=4, E=4): input norm 8, q 8×8=64, k 4×8=32,
	// v 32, o 8×8=64, q_norm 4, k_norm 4, post norm 8, router 4×8=32 → 248
	// elements; padded over 2 ranks (every dim 0 even except none) = 248;
	// all-gather S in bf16 = 496 bytes.
	l := moetest.FSDPLayout(t, 2, 1, 2)
	s := schedFor(t, cfg, l, moe.AC{Mode: moe.ACNone}, 1)
	T := int64(2 * 4)
	for _, o := range s.Ops {
		if o.Type != OpCollective {
			continue
		}
		if o.Unit.Experts && (o.Purpose == PurposeGather || o.Purpose == PurposeGradReduce) {
			t.Errorf("expert unit collective on one-member efsdp group: %s", o)
		}
		if o.Purpose == PurposeGather && o.Unit.Layer == 0 && o.Bytes() != 496 {
			t.Errorf("L0 dense gather = %d B, want 496", o.Bytes())
		}
		if o.Purpose == PurposeDispatch && o.Bytes() != T*2*8*2 {
			// T·K rows of D bf16: 8·2·8·2 = 256 bytes.
			t.Errorf("dispatch = %d B, want %d", o.Bytes(), T*2*8*2)
		}
	}
	var b strings.Builder
	if err := s.Print(&b); err != nil || !strings.Contains(b.String(), "all_to_all dispatch on ep") {
		t.Errorf("Print: %v\n%s", err, b.String())
	}
}

func TestScheduleDepsAcyclic(t *testing.T) {
	cfg := moetest.TinyMoE()
	for _, sh := range []job.Sharding{job.ShardFSDP, job.ShardZeRO2, job.ShardZeRO1, job.ShardDDP} {
		l := moetest.FSDPLayout(t, 8, 2, 2)
		l.Sharding = sh
		s := schedFor(t, cfg, l, moe.AC{Mode: moe.ACLayer, Every: 2}, 2)
		for _, o := range s.Ops {
			for _, d := range o.Deps {
				if d < 0 || d >= o.ID {
					t.Fatalf("%s: op %d depends on %d (must be an earlier op)", sh, o.ID, d)
				}
			}
		}
		// The schedule carries the memory package's timeline unchanged.
		rep, err := memory.Estimate(cfg, l, memory.Batch{LBS: 2, Seq: 4, GradAccum: 2}, memory.Options{AC: s.AC})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Timeline(); !reflect.DeepEqual(got, rep.Events) {
			t.Errorf("%s: schedule timeline (%d events) differs from memory's (%d)", sh, len(got), len(rep.Events))
		}
		p, err := memory.Replay(s.Timeline(), memory.DefaultAllocator, memory.Expandable)
		if err != nil || p.Allocated != rep.Peak.Allocated || s.Peak.Allocated != p.Allocated {
			t.Errorf("%s: replayed peak %d (%v), memory %d, schedule %d", sh, p.Allocated, err, rep.Peak.Allocated, s.Peak.Allocated)
		}
		// Each event sits on a compute op of its own phase and micro-step
		// (the optimizer's on the optimizer op). Its layer may be an earlier
		// unit's: the memory timeline frees a unit's reduce-scatter buffer
		// during the next unit's backward.
		for _, o := range s.Ops {
			for _, e := range o.Mem {
				ok := o.Type == OpCompute && (e.Phase == memory.Optimizer && o.Phase == PhaseOptimizer ||
					e.Micro == o.Micro && (e.Phase == memory.Forward) == (o.Phase == PhaseForward))
				if !ok {
					t.Errorf("%s: op %s holds %s", sh, o, e)
				}
			}
		}
	}
}

// TestScheduleGradSyncLastOnly: with grad-sync-last-only and grad-accum 3
// on HSDP 2×2 (ep 1: 6 units, all sharded), the gradient collectives run
// in the last micro-step only, once per unit: 6 reduce-scatters and 6
// replica all-reduces (18 of each when syncing every micro-step), and the
// reduce-scatters use the reduce type. The schedule still carries memory's
// timeline unchanged, each event on a compute op of its phase and
// micro-step, except the free of an accumulator from micro-step 0, which
// sits on the last micro-step's op that reduces it.
func TestScheduleGradSyncLastOnly(t *testing.T) {
	cfg := moetest.TinyMoE()
	l := moetest.FSDPLayout(t, 4, 2, 1)
	l.GradSyncLastOnly = true
	const micro = 3
	m, err := NewMesh(l, cfg, 8)
	if err != nil {
		t.Fatal(err)
	}
	rec := job.EagerRecipe()
	rec.ReduceDType = moe.BF16
	s, err := BuildSchedule(ScheduleSpec{Spec: job.Spec{Model: cfg, AC: moe.AC{Mode: moe.ACFull}, Batch: job.Batch{LBS: 2, Seq: 4, GradAccum: micro}, Recipe: rec}, Mesh: m})
	if err != nil {
		t.Fatal(err)
	}
	got := countColl(s)
	if got[PurposeGradReduce] != 6 || got[PurposeGradReplica] != 6 {
		t.Errorf("reduce-scatters %d (want 6), replica all-reduces %d (want 6)", got[PurposeGradReduce], got[PurposeGradReplica])
	}
	for _, o := range s.Ops {
		if (o.Purpose == PurposeGradReduce || o.Purpose == PurposeGradReplica) && (o.Micro != micro-1 || o.DType != moe.BF16) {
			t.Errorf("%s: want micro-step %d, bf16", o, micro-1)
		}
	}
	rep, err := memory.Estimate(cfg, l, memory.Batch{LBS: 2, Seq: 4, GradAccum: micro}, memory.OptionsOf(rec, s.AC))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s.Timeline(), rep.Events) || s.Peak.Allocated != rep.Peak.Allocated {
		t.Errorf("schedule timeline (%d events, peak %d) differs from memory's (%d, %d)", len(s.Timeline()), s.Peak.Allocated, len(rep.Events), rep.Peak.Allocated)
	}
	for _, o := range s.Ops {
		for _, e := range o.Mem {
			own := e.Micro == o.Micro && (e.Phase == memory.Forward) == (o.Phase == PhaseForward)
			acc := e.Label == "accumulated_grads" && !e.Alloc && e.Micro == 0 && o.Micro == micro-1 && o.Phase != PhaseForward
			if o.Type != OpCompute || !(own || acc || e.Phase == memory.Optimizer && o.Phase == PhaseOptimizer) {
				t.Errorf("op %s holds %s", o, e)
			}
		}
	}
}

// TestScheduleNoMemory: without the memory timeline the program is the same
// ops in the same order; only Setup, each op's Mem and Peak are empty.
func TestScheduleNoMemory(t *testing.T) {
	cfg := moetest.TinyMoE()
	l := job.Layout{GPUs: 4, DPShard: 2, DPReplicate: 2, EP: 2, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	m, err := NewMesh(l, cfg, 8)
	if err != nil {
		t.Fatal(err)
	}
	spec := ScheduleSpec{Spec: job.Spec{Model: cfg, AC: moe.AC{Mode: moe.ACSelective}, Batch: job.Batch{LBS: 2, Seq: 4, GradAccum: 2}, Recipe: job.EagerRecipe()}, Mesh: m}
	with, err := BuildSchedule(spec)
	if err != nil {
		t.Fatal(err)
	}
	spec.NoMemory = true
	without, err := BuildSchedule(spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(without.Setup) != 0 || without.Peak.Allocated != 0 || len(with.Setup) == 0 {
		t.Fatalf("setup %d events (with memory %d), peak %d: want none without memory", len(without.Setup), len(with.Setup), without.Peak.Allocated)
	}
	if len(with.Ops) != len(without.Ops) {
		t.Fatalf("%d ops without memory, %d with", len(without.Ops), len(with.Ops))
	}
	for i := range with.Ops {
		o := with.Ops[i]
		o.Mem = nil
		if !reflect.DeepEqual(o, without.Ops[i]) {
			t.Fatalf("op %d: %s without memory, %s with", i, without.Ops[i], o)
		}
	}
}

// FSDP2 keeps one gradient reduce-scatter in flight (pytorch 010ae4a8
// _fsdp_param_group.py post_backward; FSDPState's final callback): after a
// unit's reduce-scatter is issued, the next compute op waits for the
// reduce-scatter issued before it, and the first compute of the next
// micro-step waits for the backward's last one. On the tiny MoE with 4
// ranks (6 units, one reduce-scatter each, two micro-steps): reduce-
// scatters 2…5 of a backward each make the following compute op wait for
// their predecessor, and micro-step 1's first forward compute waits for
// micro-step 0's sixth (after the sixth, the final callback's wait for it
// subsumes the post-backward wait for the fifth: one stream runs them in
// order).
func TestScheduleOneReduceScatterInFlight(t *testing.T) {
	cfg := moetest.TinyMoE()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := schedFor(t, cfg, moetest.FSDPLayout(t, 4, 1, 2), moe.AC{Mode: moe.ACNone}, 2)
	nextCompute := func(after int) (int, bool) {
		for j := after + 1; j < len(s.Ops); j++ {
			if s.Ops[j].Type == OpCompute {
				return j, true
			}
		}
		return 0, false
	}
	for micro := 0; micro < 2; micro++ {
		var rs []int
		for i, o := range s.Ops {
			if o.Purpose == PurposeGradReduce && o.Micro == micro {
				rs = append(rs, i)
			}
		}
		if len(rs) != 6 {
			t.Fatalf("micro-step %d: %d reduce-scatters, want 6", micro, len(rs))
		}
		for k := 1; k < len(rs)-1; k++ {
			j, ok := nextCompute(rs[k])
			if !ok || !slicesContains(s.Ops[j].Deps, rs[k-1]) {
				t.Errorf("micro-step %d: compute op %d after reduce-scatter %d does not wait for reduce-scatter %d (deps %v)", micro, j, rs[k], rs[k-1], s.Ops[j].Deps)
			}
		}
		j, ok := nextCompute(rs[len(rs)-1])
		if !ok || !slicesContains(s.Ops[j].Deps, rs[len(rs)-1]) {
			t.Errorf("micro-step %d: the compute after the backward (op %d, %v) does not wait for its last reduce-scatter %d", micro, j, s.Ops[j].Deps, rs[len(rs)-1])
		}
		if micro == 0 && (s.Ops[j].Micro != 1 || s.Ops[j].Phase != PhaseForward) {
			t.Errorf("the compute after micro-step 0's backward is %+v, want micro-step 1's first forward", s.Ops[j])
		}
	}
}

func slicesContains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
