package parallel

import (
	"reflect"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/moetest"
)

// prefetchSched is the one-micro-step schedule of a three-block MoE on 4
// ranks with ep 2 (no recompute) under impl.
func prefetchSched(t *testing.T, ep int, impl moe.FSDPImpl) *Schedule {
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
// is block l−1's experts, copied out on the compute stream as their compute
// begins, right after block l−1's dispatch all-to-all. So, worked by hand
// on three blocks: block 2's all-gathers wait for block 0's dispatch, the
// head's for block 1's. In backward block l's pre-backward prefetches block
// l−1 after the work before it (the copy-out of block l's weights): block
// 0's all-gathers wait for the last op of block 2's backward, the
// embedding's for the last of block 1's. With ep = 1 (implicit
// prefetching) block 2's dense gather still waits for the compute two ops
// back, block 1's experts.
func TestSchedulePrefetchFSDP2(t *testing.T) {
	s := prefetchSched(t, 2, moe.FSDPTorch)
	d0 := opWhere(t, s, "block 0's dispatch", dispatchOf(0))
	d1 := opWhere(t, s, "block 1's dispatch", dispatchOf(1))
	for _, u := range []Unit{{Layer: 2}, {Layer: 2, Experts: true}} {
		if g := s.Ops[nthGather(t, s, u, 0)]; !reflect.DeepEqual(g.Deps, []int{d0}) {
			t.Errorf("forward all-gather of %s waits for %v, want block 0's dispatch %d", u, g.Deps, d0)
		}
	}
	head := Unit{Layer: 3}
	if g := s.Ops[nthGather(t, s, head, 0)]; !reflect.DeepEqual(g.Deps, []int{d1}) {
		t.Errorf("the head's all-gather waits for %v, want block 1's dispatch %d", g.Deps, d1)
	}
	pre2 := opWhere(t, s, "block 2's backward pre", computeOf(2, PhaseBackward, SegPre))
	for _, u := range []Unit{{Layer: 0}, {Layer: 0, Experts: true}} {
		if g := s.Ops[nthGather(t, s, u, 1)]; !reflect.DeepEqual(g.Deps, []int{pre2}) {
			t.Errorf("backward all-gather of %s waits for %v, want block 2's last backward op %d", u, g.Deps, pre2)
		}
	}
	pre1 := opWhere(t, s, "block 1's backward pre", computeOf(1, PhaseBackward, SegPre))
	if g := s.Ops[nthGather(t, s, Unit{Layer: moe.LayerEmbed}, 1)]; !reflect.DeepEqual(g.Deps, []int{pre1}) {
		t.Errorf("the embedding's backward all-gather waits for %v, want block 1's last backward op %d", g.Deps, pre1)
	}

	s = prefetchSched(t, 1, moe.FSDPTorch)
	ex1 := opWhere(t, s, "block 1's experts", computeOf(1, PhaseForward, SegExperts))
	if g := s.Ops[nthGather(t, s, Unit{Layer: 2}, 0)]; !reflect.DeepEqual(g.Deps, []int{ex1}) {
		t.Errorf("ep 1: block 2's all-gather waits for %v, want block 1's experts %d (implicit prefetching)", g.Deps, ex1)
	}
}

// TestScheduleMegatronFSDP: Megatron's FSDP (Megatron-LM 1e057005
// custom_fsdp) gathers the next layer at a layer's pre-forward, and c10d's
// NCCL stream waits for the compute stream when the gather is issued: block
// 2's dense and expert gathers wait for block 0's last compute, the head's
// for block 1's. It frees every layer after forward, so block 2 is gathered
// again in backward, after the head's forward. A layer's post-backward hook
// reduces its experts' and dense gradients together after the layer's
// backward, and the queue keeps up to twice the mean unit: before layer l's
// reductions the compute stream waits for layer l+2's, so the embedding's
// backward, after layer 0's reductions, waits for layer 2's and not layer
// 1's (FSDP2 would wait for layer 0's dense reduce-scatter's predecessor).
func TestScheduleMegatronFSDP(t *testing.T) {
	s := prefetchSched(t, 2, moe.FSDPMegatron)
	post0 := opWhere(t, s, "block 0's post", computeOf(0, PhaseForward, SegPost))
	for _, u := range []Unit{{Layer: 2}, {Layer: 2, Experts: true}} {
		if g := s.Ops[nthGather(t, s, u, 0)]; !reflect.DeepEqual(g.Deps, []int{post0}) {
			t.Errorf("forward all-gather of %s waits for %v, want block 0's post %d", u, g.Deps, post0)
		}
	}
	headFwd := opWhere(t, s, "the head's forward", computeOf(3, PhaseForward, SegHead))
	if g := s.Ops[nthGather(t, s, Unit{Layer: 2, Experts: true}, 1)]; !reflect.DeepEqual(g.Deps, []int{headFwd}) {
		t.Errorf("block 2's experts are gathered again in backward after %v, want the head's forward %d", g.Deps, headFwd)
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
	deps := s.Ops[embBwd].Deps
	for _, u := range []Unit{{Layer: 2}, {Layer: 2, Experts: true}} {
		if !slicesContains(deps, rs[u]) {
			t.Errorf("the embedding's backward (deps %v) does not wait for %s's reduction %d", deps, u, rs[u])
		}
	}
	for _, u := range []Unit{{Layer: 1}, {Layer: 1, Experts: true}} {
		if slicesContains(deps, rs[u]) {
			t.Errorf("the embedding's backward (deps %v) waits for %s's reduction %d: the queue holds two layers", deps, u, rs[u])
		}
	}
}
