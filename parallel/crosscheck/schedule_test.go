package crosscheck

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric"
	"github.com/moescope/moescope/parallel/sim"
)

// One schedule, two executions: the numeric backend runs a step on small
// meshes and records its collectives and each rank's routing; the
// virtual-time backend, fed the per-expert counts the numeric run recorded,
// walks the same schedule. They agree on the ops (every schedule op runs
// once), on every collective (kind, axis, dtype, size in the same order as
// each numeric rank issued them) and on the bytes at the modelled dtype;
// for all-to-alls, whose per-rank size depends on routing, the simulated
// rank's size equals the largest any rank of the EP group sent or received
// in that layer (the rank every all-to-all waits for).
func TestScheduleAgreesWithNumeric(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		gpus, rep, ep int
		ac            moe.AC
	}{
		{2, 1, 2, moe.AC{Mode: moe.ACNone}},
		{4, 1, 4, moe.AC{Mode: moe.ACFull}},
		{4, 1, 2, moe.AC{Mode: moe.ACSelective}},
		{4, 2, 2, moe.AC{Mode: moe.ACNone}},
		{4, 1, 2, moe.AC{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoE}}, // Megatron's moe module re-runs the all-to-alls
	}
	const lbs, seq = 2, 16
	skewed := 0
	for _, tc := range cases {
		l := job.Layout{GPUs: tc.gpus, DPReplicate: tc.rep, DPShard: tc.gpus / tc.rep, EP: tc.ep, Sharding: job.ShardFSDP, ReshardAfterForward: true}
		name := fmt.Sprintf("%d×%d ep %d %s", tc.rep, tc.gpus/tc.rep, tc.ep, tc.ac)
		m, err := parallel.NewMesh(l, cfg, 8)
		if err != nil {
			t.Fatal(err)
		}
		init, err := ref.NewModel[float32](cfg)
		if err != nil {
			t.Fatal(err)
		}
		init.InitRandom(5)
		n, err := numeric.New(numeric.Spec{Spec: job.Spec{Model: cfg, AC: tc.ac, Batch: job.Batch{LBS: lbs, Seq: seq, GradAccum: 1}}, Mesh: m, AdamW: ref.DefaultAdamW, AuxCoef: cfg.AuxLossCoef}, init.Tensors())
		if err != nil {
			t.Fatal(err)
		}
		n.Comm().Trace = true
		step, err := n.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		traces := n.Comm().Traces()
		// The per-expert counts the numeric run recorded, summed over EP
		// group 0 (rank 0's), per MoE layer.
		group := m.Group(parallel.AxisEP, 0).Ranks
		var counts [][]int64
		for li := 0; li < cfg.Layers; li++ {
			if !cfg.MoELayer[li] {
				continue
			}
			row := make([]int64, cfg.Experts)
			for _, r := range group {
				c := step.ExpertCounts[0][r][li]
				if len(c) != cfg.Experts {
					t.Fatalf("%s: rank %d layer %d recorded %d expert counts", name, r, li, len(c))
				}
				for e, c := range c {
					row[e] += int64(c)
				}
			}
			counts = append(counts, row)
		}
		res, err := sim.Simulate(sim.Input{Spec: job.Spec{Model: cfg, Layout: l, AC: tc.ac, Batch: job.Batch{LBS: lbs, Seq: seq, GradAccum: 1}, Recipe: job.EagerRecipe()}, ExpertCounts: counts, KeepTimeline: true})
		if err != nil {
			t.Fatal(err)
		}
		s := res.Schedule
		timings := res.OpTimings()
		if len(timings) != len(s.Ops) {
			t.Fatalf("%s: %d timings for %d ops", name, len(timings), len(s.Ops))
		}
		for i, sp := range timings {
			if !(sp.EndS >= sp.StartS && sp.EndS <= res.StepTimeS) {
				t.Errorf("%s: op %d ran %+v outside the step", name, i, sp)
			}
		}
		var collIdx []int
		for i, o := range s.Ops {
			if o.Type == parallel.OpCollective {
				collIdx = append(collIdx, i)
			}
		}
		// The largest all-to-all size any rank of group 0 moved, per layer.
		maxA2A := map[int]int64{}
		for _, r := range group {
			for k, g := range traces[r] {
				if k < len(collIdx) && g.Kind == parallel.CollAllToAll && s.Ops[collIdx[k]].Purpose != parallel.PurposeCounts {
					maxA2A[s.Ops[collIdx[k]].Layer] = max(maxA2A[s.Ops[collIdx[k]].Layer], g.Elements)
				}
			}
		}
		uniform := int64(lbs*seq*cfg.TopK) * int64(cfg.Hidden)
		for _, v := range maxA2A {
			if v > uniform {
				skewed++
			}
		}
		for r, got := range traces {
			if len(got) != len(collIdx) {
				t.Fatalf("%s rank %d: numeric ran %d collectives, the simulated schedule has %d", name, r, len(got), len(collIdx))
			}
			for k, g := range got {
				o := s.Ops[collIdx[k]]
				if g.Kind != o.Coll || g.Axis != o.Axis || g.DType != o.DType {
					t.Fatalf("%s rank %d collective %d: numeric %+v, simulated %s", name, r, k, g, o)
				}
				if g.Kind != parallel.CollAllToAll && g.Elements != o.Elements {
					t.Errorf("%s rank %d collective %d: numeric %d elements, simulated %d", name, r, k, g.Elements, o.Elements)
				}
			}
		}
		for _, i := range collIdx {
			o := s.Ops[i]
			want := float64(o.Bytes())
			if o.Coll == parallel.CollAllToAll && o.Purpose != parallel.PurposeCounts {
				want = float64(maxA2A[o.Layer] * o.DType.Bytes())
			}
			if math.Abs(timings[i].Bytes-want) > 1e-9*want {
				t.Errorf("%s: op %d (%s) simulated %g bytes, numeric run %g", name, i, o, timings[i].Bytes, want)
			}
		}
	}
	if skewed == 0 {
		t.Error("routing was balanced in every case: the all-to-all check compared nothing routing-dependent")
	}
}
