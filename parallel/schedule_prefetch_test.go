package parallel

import (
	"reflect"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
)

// prefetchSched is the one-micro-step schedule of a three-block MoE on 4
// ranks with ep 2 (no recompute) under impl.
func prefetchSched(t *testing.T, ep int, impl job.FSDPImpl) *Schedule {
	t.Helper()
	cfg := moetest.TinyMoELayers(true, true, true)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	l := moetest.FSDPLayout(t, 4, 1, ep)
	l.FSDPImpl = impl
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	return schedFor(t, cfg, l, moe.AC{Mode: moe.ACNone}, 1)
}

// nthGather is the id of the n-th all-gather (0: forward, 1: backward) of u.
func nthGather(t *testing.T, s *Schedule, u Unit, n int) int {
	t.Helper()
	for i, o := range s.Ops {
		if o.Purpose == PurposeGather && o.Unit == u {
			if n == 0 {
				return i
			}
			n--
		}
	}
	t.Fatalf("no all-gather %d of %s", n, u)
	return -1
}

// opWhere is the id of the first op pred holds for.
func opWhere(t *testing.T, s *Schedule, what string, pred func(o ScheduleOp) bool) int {
	t.Helper()
	for i, o := range s.Ops {
		if pred(o) {
			return i
		}
	}
	t.Fatalf("no %s", what)
	return -1
}

func computeOf(layer int, ph Phase, seg Segment) func(ScheduleOp) bool {
	return func(o ScheduleOp) bool {
		return o.Type == OpCompute && o.Layer == layer && o.Phase == ph && o.Segment == seg
	}
}

func dispatchOf(layer int) func(ScheduleOp) bool {
	return func(o ScheduleOp) bool { return o.Purpose == PurposeDispatch && o.Layer == layer }
}

// TestSchedulePrefetchFSDP2: with ep > 1 torchtitan v0.2.2 sets FSDP2's
// explicit prefetching (73a0e69 models/llama4/infra/parallelize.py
// apply_fsdp): block l's pre-forward, after waiting for its own weights,
// issues block l+1's and its experts' all-gathers; the all-gather streams
// first wait for the copy-out of the unit unsharded before block l, which
// is block l−1's experts. Their pre-forward hook is prepended, so that
// copy-out runs right after block l−1's pre segment, before torchtitan's
// dispatch hook, and the dispatch waits for the experts' all-gather. So,
// worked by hand on three blocks: block 2's all-gathers wait for block 0's
// pre segment, the head's for block 1's. In backward block l's
// pre-backward prefetches block l−1 after the work on the compute stream:
// the last op of block l+1's backward and the reduce-scatter that compute
// already waits for (one in flight: block l+1's experts'). With ep = 1
// (implicit prefetching) block 2's dense gather still waits for the
// compute two ops back, block 1's experts.
func TestSchedulePrefetchFSDP2(t *testing.T) {
	s := prefetchSched(t, 2, job.FSDPTorch)
	pre0 := opWhere(t, s, "block 0's pre", computeOf(0, PhaseForward, SegPre))
	pre1 := opWhere(t, s, "block 1's pre", computeOf(1, PhaseForward, SegPre))
	for _, u := range []Unit{{Layer: 2}, {Layer: 2, Experts: true}} {
		if g := s.Ops[nthGather(t, s, u, 0)]; !reflect.DeepEqual(g.Deps, []int{pre0}) {
			t.Errorf("forward all-gather of %s waits for %v, want block 0's pre segment %d", u, g.Deps, pre0)
		}
	}
	head := Unit{Layer: 3}
	if g := s.Ops[nthGather(t, s, head, 0)]; !reflect.DeepEqual(g.Deps, []int{pre1}) {
		t.Errorf("the head's all-gather waits for %v, want block 1's pre segment %d", g.Deps, pre1)
	}
	for l := 0; l < 3; l++ {
		counts := s.Ops[opWhere(t, s, "counts", func(o ScheduleOp) bool { return o.Purpose == PurposeCounts && o.Layer == l })]
		if ag := nthGather(t, s, Unit{Layer: l, Experts: true}, 0); !slicesContains(counts.Deps, ag) {
			t.Errorf("block %d's dispatch (deps %v) does not wait for its experts' all-gather %d", l, counts.Deps, ag)
		}
	}
	rsOf := func(u Unit) int {
		return opWhere(t, s, "reduce-scatter", func(o ScheduleOp) bool { return o.Purpose == PurposeGradReduce && o.Unit == u })
	}
	pre2b := opWhere(t, s, "block 2's backward pre", computeOf(2, PhaseBackward, SegPre))
	want := []int{pre2b, rsOf(Unit{Layer: 2, Experts: true})}
	for _, u := range []Unit{{Layer: 0}, {Layer: 0, Experts: true}} {
		if g := s.Ops[nthGather(t, s, u, 1)]; !reflect.DeepEqual(g.Deps, want) {
			t.Errorf("backward all-gather of %s waits for %v, want block 2's last backward op and its experts' reduce-scatter %v", u, g.Deps, want)
		}
	}
	pre1b := opWhere(t, s, "block 1's backward pre", computeOf(1, PhaseBackward, SegPre))
	want = []int{pre1b, rsOf(Unit{Layer: 1, Experts: true})}
	if g := s.Ops[nthGather(t, s, Unit{Layer: moe.LayerEmbed}, 1)]; !reflect.DeepEqual(g.Deps, want) {
		t.Errorf("the embedding's backward all-gather waits for %v, want %v", g.Deps, want)
	}

	s = prefetchSched(t, 1, job.FSDPTorch)
	ex1 := opWhere(t, s, "block 1's experts", computeOf(1, PhaseForward, SegExperts))
	if g := s.Ops[nthGather(t, s, Unit{Layer: 2}, 0)]; !reflect.DeepEqual(g.Deps, []int{ex1}) {
		t.Errorf("ep 1: block 2's all-gather waits for %v, want block 1's experts %d (implicit prefetching)", g.Deps, ex1)
	}
}

// TestScheduleMegatronFSDP: Megatron's FSDP (Megatron-LM 1e057005
// custom_fsdp), worked by hand on three equal MoE layers.
//   - A layer's pre-forward gathers the next layer, and c10d's NCCL stream
//     waits for the compute stream when the gather is issued: layer 2's
//     dense and expert gathers wait for layer 0's last compute. A layer
//     waits for all its buckets: its pre segment for its experts' gather.
//   - Every layer is freed after forward and the output layer, not a unit,
//     has no pre-backward hook: layer 2 is gathered again in backward when
//     its own hook issues it, after the head's backward.
//   - The embedding and output layer are gathered once per step and
//     reduced at the end of each backward.
//   - A layer's experts are reduced with its dense weights after its whole
//     backward. The queue holds twice the mean layer (2U, U = e + d for
//     expert and dense buckets e and d): before layer 0's dense reduction
//     it holds layers 2 and 1 and layer 0's experts, 2U + e > 2U, so the
//     oldest, layer 2's experts, is waited for, and nothing else: the
//     embedding's backward waits for layer 2's experts only.
func TestScheduleMegatronFSDP(t *testing.T) {
	s := prefetchSched(t, 2, job.FSDPMegatron)
	post0 := opWhere(t, s, "block 0's post", computeOf(0, PhaseForward, SegPost))
	for _, u := range []Unit{{Layer: 2}, {Layer: 2, Experts: true}} {
		if g := s.Ops[nthGather(t, s, u, 0)]; !reflect.DeepEqual(g.Deps, []int{post0}) {
			t.Errorf("forward all-gather of %s waits for %v, want block 0's post %d", u, g.Deps, post0)
		}
	}
	for l := 0; l < 3; l++ {
		pre := s.Ops[opWhere(t, s, "pre", computeOf(l, PhaseForward, SegPre))]
		if ag := nthGather(t, s, Unit{Layer: l, Experts: true}, 0); !slicesContains(pre.Deps, ag) {
			t.Errorf("layer %d's pre segment (deps %v) does not wait for its experts' all-gather %d", l, pre.Deps, ag)
		}
	}
	headBwd := opWhere(t, s, "the head's backward", computeOf(3, PhaseBackward, SegHead))
	if g := s.Ops[nthGather(t, s, Unit{Layer: 2, Experts: true}, 1)]; !reflect.DeepEqual(g.Deps, []int{headBwd}) {
		t.Errorf("block 2's experts are gathered again in backward after %v, want the head's backward %d", g.Deps, headBwd)
	}
	rs := map[Unit]int{}
	for i, o := range s.Ops {
		if o.Purpose == PurposeGradReduce {
			rs[o.Unit] = i
		}
	}
	for l := 0; l < 3; l++ {
		pre := opWhere(t, s, "backward pre", computeOf(l, PhaseBackward, SegPre))
		ex := s.Ops[rs[Unit{Layer: l, Experts: true}]]
		if !reflect.DeepEqual(ex.Deps, []int{pre}) || rs[Unit{Layer: l, Experts: true}] < pre {
			t.Errorf("layer %d's experts are reduced after %v, want after the layer's backward %d", l, ex.Deps, pre)
		}
	}
	embBwd := opWhere(t, s, "the embedding's backward", computeOf(moe.LayerEmbed, PhaseBackward, SegEmbed))
	if deps, want := s.Ops[embBwd].Deps, []int{rs[Unit{Layer: 2, Experts: true}]}; !reflect.DeepEqual(deps, want) {
		t.Errorf("the embedding's backward waits for %v, want layer 2's experts' reduction only %v", deps, want)
	}
	for _, u := range []Unit{{Layer: 3}, {Layer: moe.LayerEmbed}} {
		if rs[u] < embBwd {
			t.Errorf("%s is reduced (op %d) before the embedding's backward %d, not at the backward's end", u, rs[u], embBwd)
		}
	}

	cfg := moetest.TinyMoELayers(true, true, true)
	l := moetest.FSDPLayout(t, 4, 1, 2)
	l.FSDPImpl = job.FSDPMegatron
	s = schedFor(t, cfg, l, moe.AC{Mode: moe.ACNone}, 2)
	for _, u := range []Unit{{Layer: 3}, {Layer: moe.LayerEmbed}} {
		n := 0
		for _, o := range s.Ops {
			if o.Purpose == PurposeGather && o.Unit == u {
				n++
			}
		}
		if n != 1 {
			t.Errorf("two micro-steps gather %s %d times, want once", u, n)
		}
	}
}
