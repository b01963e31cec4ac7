package crosscheck

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/parallel"
)

// passEvent is what a backend did to one unit's gathered weights in one
// pass of one micro-step: gathered them before its compute, freed them
// after.
type passEvent struct {
	pass           int // 2·micro + 0 forward, + 1 backward
	layer          int
	gather, freeIt bool
}

// orderEvents is what the step's order says the backends do: a gather and a
// free per phase that has them.
func orderEvents(o job.StepOrder) map[passEvent]bool {
	want := map[passEvent]bool{}
	for _, p := range o.Phases() {
		e := passEvent{pass: 2*p.Micro + int(p.Pass), layer: p.Layer}
		if p.Gather {
			want[passEvent{e.pass, e.layer, true, false}] = true
		}
		if p.Free {
			want[passEvent{e.pass, e.layer, false, true}] = true
		}
	}
	return want
}

// memoryEvents reads the gathers and frees of weights off memory's
// timeline, the pass counted by the phases' changes.
func memoryEvents(evs []memory.Event) map[passEvent]bool {
	got := map[passEvent]bool{}
	pass, last := -1, memory.Setup
	for _, e := range evs {
		if e.Phase != last && (e.Phase == memory.Forward || e.Phase == memory.Backward) {
			pass++
		}
		last = e.Phase
		if e.Category == memory.CatWeights && e.Phase != memory.Setup {
			got[passEvent{pass, e.Layer, e.Alloc, !e.Alloc}] = true
		}
	}
	return got
}

// scheduleGathers reads the schedule's all-gathers of dense units, each in
// the pass of the compute op that follows it (a gather is emitted where a
// compute asks for it; a recompute belongs to its backward).
func scheduleGathers(s *parallel.Schedule) map[passEvent]bool {
	got := map[passEvent]bool{}
	var pending []int
	for _, o := range s.Ops {
		switch {
		case o.Type == parallel.OpCollective && o.Purpose == parallel.PurposeGather && !o.Unit.Experts:
			pending = append(pending, o.Layer)
		case o.Type == parallel.OpCompute && o.Phase != parallel.PhaseOptimizer:
			pass := 2 * o.Micro
			if o.Phase != parallel.PhaseForward {
				pass++
			}
			for _, l := range pending {
				got[passEvent{pass, l, true, false}] = true
			}
			pending = nil
		}
	}
	return got
}

// gathersOnly keeps the gathers of m.
func gathersOnly(m map[passEvent]bool) map[passEvent]bool {
	out := map[passEvent]bool{}
	for e := range m {
		if e.gather {
			out[e] = true
		}
	}
	return out
}

// TestBackendsWalkTheOrder: one property of the shared step order for
// every FSDP mode the order distinguishes (FSDP2 and Megatron-FSDP,
// reshard after forward or not, keep-gathered, the last-only options, a
// tied embedding) and for ZeRO: memory's timeline gathers and frees each
// unit's weights exactly in the passes the order says, and the schedule
// all-gathers exactly where the order gathers (FSDP over more than one
// shard). The numeric ranks issue the schedule's collectives, gathers
// included, in its order: numeric's TestNumericFollowsSchedule, with the
// order's FSDP2 variants among its cases.
func TestBackendsWalkTheOrder(t *testing.T) {
	for _, tied := range []bool{false, true} {
		cfg := *moetest.TinyMoE()
		cfg.TiedEmbeddings = tied
		for _, l := range orderLayouts(t) {
			for _, micro := range []int{1, 3} {
				name := fmt.Sprintf("tied %v %s %s ra %v keep %v gsl %v arl %v micro %d", tied, l.Sharding, l.FSDPImpl,
					l.ReshardAfterForward, l.KeepGathered, l.GradSyncLastOnly, l.AllreduceLastOnly, micro)
				checkWalk(t, name, &cfg, l, micro)
			}
		}
	}
}

// orderLayouts is TestBackendsWalkTheOrder's layouts on 4 GPUs, 2 replicas
// of 2 shards, ep 2.
func orderLayouts(t *testing.T) []job.Layout {
	var out []job.Layout
	for _, sh := range []job.Sharding{job.ShardFSDP, job.ShardZeRO1} {
		for _, impl := range []job.FSDPImpl{"", job.FSDPMegatron} {
			for _, flags := range []int{0, 1, 2, 3, 4, 5, 6, 7, 8} {
				l := moetest.FSDPLayout(t, 4, 2, 2)
				l.Sharding = sh
				l.ReshardAfterForward = flags&1 == 0
				l.KeepGathered = flags&2 != 0
				l.GradSyncLastOnly = flags&4 != 0
				l.AllreduceLastOnly = flags == 8
				if sh == job.ShardFSDP {
					l.FSDPImpl = impl
				} else if impl != "" || flags > 1 {
					continue
				}
				if l.Resolve() == nil {
					out = append(out, l)
				}
			}
		}
	}
	return out
}

// checkWalk checks TestBackendsWalkTheOrder's property for one layout.
func checkWalk(t *testing.T, name string, cfg *moe.Config, l job.Layout, micro int) {
	t.Helper()
	o := job.NewStepOrder(cfg, l, micro)
	want := orderEvents(o)
	b := job.Batch{LBS: 1, Seq: 4, GradAccum: micro}
	rep, err := memory.Estimate(cfg, l, memory.Batch{LBS: 1, Seq: 4, GradAccum: micro}, memory.OptionsOf(job.EagerRecipe(), moe.AC{Mode: moe.ACFull}))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if got := memoryEvents(rep.Events); !reflect.DeepEqual(got, want) {
		t.Errorf("%s: memory's weight events %v, the order's %v", name, got, want)
	}
	m, err := parallel.NewMesh(l, cfg, 4)
	if err != nil {
		t.Fatal(err)
	}
	s, err := parallel.BuildSchedule(parallel.ScheduleSpec{Spec: job.Spec{Model: cfg, AC: moe.AC{Mode: moe.ACFull}, Batch: b, Recipe: job.EagerRecipe()}, Mesh: m, NoMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	wantGathers := map[passEvent]bool{}
	if l.Sharding == job.ShardFSDP {
		wantGathers = gathersOnly(want)
	}
	if got := scheduleGathers(s); !reflect.DeepEqual(got, wantGathers) {
		t.Errorf("%s: the schedule's gathers %v, the order's %v", name, got, wantGathers)
	}
}
