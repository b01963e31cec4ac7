package sim

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
)

// pipelineConfig is moetest's tiny MoE with layers identical blocks.
func pipelineConfig(layers int) *moe.Config {
	return moetest.TinyMoELayers(slices.Repeat([]bool{true}, layers)...)
}

// TestPipelineBubble is the hand-derived bubble: identical stages (a
// forward of f and a backward of b per micro-batch on each rank, split
// evenly over its v stages), messages, FSDP and optimizer free, m a
// multiple of pp. Every rank then idles (pp − 1)·(f + b) of a step of
// (m + pp − 1)·(f + b) under 1F1B and GPipe, and (pp − 1)·(f + b)/v of
// m·(f + b) + (pp − 1)·(f + b)/v under Interleaved1F1B (Narayanan et al.
// 2021, §2.2): idle fractions (pp − 1)/(m + pp − 1) and
// (pp − 1)/(v·m + pp − 1), on every rank.
func TestPipelineBubble(t *testing.T) {
	for _, c := range []struct {
		s        job.PPSchedule
		pp, v, m int
		f, b     float64
	}{
		{job.PP1F1B, 4, 1, 8, 1, 2},
		{job.PP1F1B, 2, 1, 2, 0.3, 0.6},
		{job.PP1F1B, 8, 1, 16, 1, 1},
		{job.PPGPipe, 4, 1, 8, 1, 2},
		{job.PPGPipe, 3, 1, 6, 0.5, 1.5},
		{job.PPInterleaved1F1B, 2, 2, 4, 1, 2},
		{job.PPInterleaved1F1B, 4, 2, 8, 1, 2},
		{job.PPInterleaved1F1B, 4, 3, 8, 1, 1},
		{job.PPInterleaved1F1B, 4, 2, 4, 1, 2},
	} {
		name := fmt.Sprintf("%s pp %d v %d m %d f %g b %g", c.s, c.pp, c.v, c.m, c.f, c.b)
		l := job.Layout{GPUs: c.pp, PP: c.pp, PPSchedule: c.s, PPVirtualStages: c.v, PPLayers: job.NewStageLayers(ones(c.pp * c.v))}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		p, err := parallel.BuildPipeline(parallel.PipelineSpec{Spec: job.Spec{Model: pipelineConfig(c.pp * c.v), Layout: l, Batch: job.Batch{LBS: c.m, Seq: 4, GradAccum: 1}, Recipe: job.EagerRecipe()}, GPUsPerNode: 8})
		if err != nil {
			t.Fatal(err)
		}
		n := c.pp * c.v
		pc := pipeCosts{fwd: make([]float64, n), bwd: make([]float64, n), rec: make([]float64, n), opt: make([]float64, c.pp),
			msg: func(int, int) float64 { return 0 }, coll: func(parallel.ScheduleOp) float64 { return 0 }}
		for s := range n {
			pc.fwd[s], pc.bwd[s] = c.f/float64(c.v), c.b/float64(c.v)
		}
		w, err := walkPipeline(p, pc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := float64(c.pp-1) / float64(c.v*c.m+c.pp-1)
		for r, wr := range w.ranks {
			if idle := 1 - wr.busy/w.step; math.Abs(idle-want) > 1e-9 {
				t.Errorf("%s rank %d: idle fraction %.12f, want %.12f", name, r, idle, want)
			}
		}
	}
}

// TestPipelineBubbleZeroBubble is the hand-derived bubble of the
// zero-bubble schedules: identical stages, each micro-batch's forward,
// backward-input and backward-weight passes t = 1 each per stage
// (backward 2, of which weight 1), messages, FSDP and optimizer free; on
// stage 0 the input pass is empty and the weight pass takes the whole
// backward, 2 (PyTorch's stage, see pipeline.go). Every rank is busy
// 3·v·m = 6m.
//
// ZBVZeroBubble: the ZB-V paper (Qi et al., arXiv 2401.10241 §6, the
// section PyTorch's ScheduleZBVZeroBubble cites) gives bubble rate 0 when
// T_F = T_B = T_W (the authors' README table, sail-sg/zero-bubble-
// pipeline-parallelism at 3a91d0c8c21755dd0f7b425e3ac5699ab00b4083), for
// the parallelogram its optimizer post-validation allows: rank r's step
// is the others' shifted by r forwards, r·t. Here the step ends with the
// last rank and every rank starts at 0, so the shift becomes idle time:
// rank pp − 1 cannot start before (pp − 1)·t (stage pp − 1's first
// forward needs pp − 1 forwards upstream) and then never waits, rank 0
// ends at 6m·t, so the step is 6m + pp − 1 and every rank idles
// (pp − 1)/(6m + pp − 1). Worked by hand for pp 2, m 3 (orders in
// moe's TestPipelineOrder): rank 0 runs 0F0-0F2 in [0, 3], rank 1 1F0 at
// [1, 2], 2F0 [2, 3], 1F1 [3, 4], 2F1 [4, 5]; rank 0 3F0 [3, 4], 3I0
// [4, 5], 3W0 [5, 6], 3F1 [6, 7], 3I1 [7, 8], 3W1 [8, 9]; rank 1 2I0
// [5, 6], 2W0 [6, 7], 1F2 [7, 8], 1I0 [8, 9], 1W0 [9, 10], 2F2 [10, 11],
// 2I1 [11, 12], 2W1 [12, 13], 1I1 [13, 14]; rank 0 0I0 at 9, 0W0
// [9, 11], 3F2 [11, 12], 3I2 [12, 13], 3W2 [13, 14], 0I1 at 14, 0W1
// [14, 16]; rank 1 2I2 [14, 15], 1I2 [15, 16], 1W1 [16, 17], 2W2
// [17, 18], 1W2 [18, 19]; rank 0 0I2 at 16, 0W2 [16, 18]: step 19, busy
// 18 on each, idle 1/19. The paper's "enough micro-batches" is m ≥
// 2·pp − 1, PyTorch's n_micro floor.
//
// InterleavedZeroBubble, pp 2, v 2, m 2 by hand: rank 0 runs 0F0 0F1 2F0
// 2F1 2I0 2W0 2I1 2W1 0I0 0W0 0I1 0W1, rank 1 1F0 1F1 3F0 3I0 3F1 3I1 3W0
// 1I0 3W1 1I1 1W0 1W1 (PyTorch's order, see moe). Rank 0: 0F0 [0, 1],
// 0F1 [1, 2], 2F0 [2, 3], 2F1 [3, 4]; rank 1: 1F0 [1, 2], 1F1 [2, 3], 3F0
// [3, 4], 3I0 [4, 5], 3F1 [5, 6], 3I1 [6, 7], 3W0 [7, 8]; rank 0: 2I0
// [5, 6], 2W0 [6, 7], 2I1 [7, 8], 2W1 [8, 9]; rank 1: 1I0 [8, 9], 3W1
// [9, 10], 1I1 [10, 11], 1W0 [11, 12], 1W1 [12, 13]; rank 0: 0I0 at 9,
// 0W0 [9, 11], 0I1 at 11, 0W1 [11, 13]: step 13, busy 12 on each, idle
// 1/13.
//
// DualPipeV, pp 2, m 4 by hand (orders in moe; a full backward takes 2):
// rank 0 0F0-0F2 [0, 3]; rank 1 1F0 [1, 2], 2F0 [2, 3], 1F1 [3, 4], 2F1
// [4, 5], 1F2 [5, 6]; rank 0 3F0 [3, 4], 3I0 [4, 5], 3W0 [5, 6], 3F1
// [6, 7], 0F3 [7, 8], 3B1 [8, 10]; rank 1 2B0 [6, 8], 2F2 [8, 9], 1B0
// [9, 11], 1F3 [11, 12], 2B1 [12, 14], 2F3 [14, 15], 1B1 [15, 17]; rank 0
// 3F2 [10, 11], 0B0 [11, 13], 3B2 [13, 15], 3F3 [15, 16], 0B1 [17, 19],
// 3B3 [19, 21]; rank 1 2B2 [17, 19], 1B2 [19, 21], 2I3 [21, 22], 1I3
// [22, 23], 2W3 [23, 24], 1W3 [24, 25]; rank 0 0I2 at 21, 0W2 [21, 23],
// 0I3 at 23, 0W3 [23, 25]: step 25, busy 24 on each, idle 1/25.
func TestPipelineBubbleZeroBubble(t *testing.T) {
	for _, c := range []struct {
		s     job.PPSchedule
		pp, m int
		want  float64
	}{
		{job.PPZBVZeroBubble, 2, 3, 1.0 / 19},
		{job.PPZBVZeroBubble, 2, 8, 1.0 / 49},
		{job.PPZBVZeroBubble, 3, 5, 2.0 / 32},
		{job.PPZBVZeroBubble, 3, 8, 2.0 / 50},
		{job.PPZBVZeroBubble, 4, 7, 3.0 / 45},
		{job.PPZBVZeroBubble, 4, 16, 3.0 / 99},
		{job.PPInterleavedZeroBubble, 2, 2, 1.0 / 13},
		{job.PPDualPipeV, 2, 4, 1.0 / 25},
	} {
		name := fmt.Sprintf("%s pp %d m %d", c.s, c.pp, c.m)
		n := 2 * c.pp
		l := job.Layout{GPUs: c.pp, PP: c.pp, PPSchedule: c.s, PPLayers: job.NewStageLayers(ones(n))}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		p, err := parallel.BuildPipeline(parallel.PipelineSpec{Spec: job.Spec{Model: pipelineConfig(n), Layout: l, Batch: job.Batch{LBS: c.m, Seq: 4, GradAccum: 1}, Recipe: job.EagerRecipe()}, GPUsPerNode: 8})
		if err != nil {
			t.Fatal(err)
		}
		pc := pipeCosts{fwd: make([]float64, n), bwd: make([]float64, n), rec: make([]float64, n), wgt: make([]float64, n), opt: make([]float64, c.pp),
			msg: func(int, int) float64 { return 0 }, coll: func(parallel.ScheduleOp) float64 { return 0 }}
		for s := range n {
			pc.fwd[s], pc.bwd[s], pc.wgt[s] = 1, 2, 1
		}
		w, err := walkPipeline(p, pc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for r, wr := range w.ranks {
			if wr.busy != float64(6*c.m) {
				t.Errorf("%s rank %d: busy %g, want 6m = %d", name, r, wr.busy, 6*c.m)
			}
			if idle := 1 - wr.busy/w.step; math.Abs(idle-c.want) > 1e-9 {
				t.Errorf("%s rank %d: idle fraction %.12f, want %.12f", name, r, idle, c.want)
			}
		}
	}
}

func ones(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

// TestSimulatePipeline runs Simulate on pipeline layouts of a small model:
// one timing per pipeline rank, the step ending with the last of them,
// torchtitan's TPS (a GPU's share of its replica's tokens: ÷ pp), the
// memory of the worst stage (memory.Estimate's), and each stage boundary
// on the link class its ranks share: pp is the outermost mesh axis, so the
// stages' first ranks are dp apart (8 GPUs per host: 4 apart share a
// host's NVLink, 8 apart do not).
func TestSimulatePipeline(t *testing.T) {
	cfg := pipelineConfig(4)
	dev, err := hw.LookupDevice("h100")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		l    job.Layout
		link string
	}{
		{job.Layout{GPUs: 8, PP: 2, DPShard: 4, EP: 2}, "nvlink"},
		{job.Layout{GPUs: 16, PP: 2, DPShard: 8}, "network"},
		{job.Layout{GPUs: 8, PP: 2, DPShard: 2, DPReplicate: 2, PPSchedule: job.PPInterleaved1F1B, PPLayers: "1,1,1,1"}, "nvlink"},
		{job.Layout{GPUs: 8, PP: 2, DPShard: 4, EP: 2, PPSchedule: job.PPZBVZeroBubble, PPLayers: "1,1,1,1"}, "nvlink"},
		{job.Layout{GPUs: 16, PP: 2, DPShard: 8, PPSchedule: job.PPInterleavedZeroBubble, PPLayers: "1,1,1,1"}, "network"},
		{job.Layout{GPUs: 8, PP: 2, DPShard: 4, PPSchedule: job.PPDualPipeV, PPLayers: "1,1,1,1"}, "nvlink"},
	} {
		l := c.l
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		const lbs, seq, accum = 4, 16, 2
		in := Input{Spec: job.Spec{Model: cfg, Layout: l, AC: moe.AC{Mode: moe.ACSelective}, Batch: job.Batch{LBS: lbs, Seq: seq, GradAccum: accum}, Recipe: job.EagerRecipe()}, Device: dev, KeepTimeline: true}
		res, err := Simulate(in)
		if err != nil {
			t.Fatalf("%+v: %v", l, err)
		}
		pl := res.Pipeline
		if pl == nil || len(pl.Stages) != l.PP {
			t.Fatalf("%+v: pipeline timing %+v", l, pl)
		}
		end := 0.0
		for _, st := range pl.Stages {
			end = math.Max(end, st.EndS)
			if !(st.IdleFraction >= 0 && st.IdleFraction < 1) {
				t.Errorf("%+v rank %d: idle fraction %v", l, st.Rank, st.IdleFraction)
			}
		}
		if res.StepTimeS != end {
			t.Errorf("%+v: step %v, last rank done at %v", l, res.StepTimeS, end)
		}
		if want := float64(lbs*seq*accum) / float64(l.PP) / res.StepTimeS; math.Abs(res.TPS-want) > 1e-9*want {
			t.Errorf("%+v: TPS %v, want %v", l, res.TPS, want)
		}
		for s, k := range pl.P2PLink {
			if l.StageRank(s) == l.StageRank(s+1) {
				if k != "same rank" {
					t.Errorf("%+v: stage boundary %d inside a rank on %s", l, s, k)
				}
				continue
			}
			if k != c.link {
				t.Errorf("%+v: stage boundary on %s, want %s", l, k, c.link)
			}
		}
		if l.PPSchedule.ZeroBubble() {
			// Both passes of every stage take time: the backward-data and
			// the backward-weight ops.
			// Stage 0's input pass is empty, its weight pass the whole
			// backward (PyTorch's stage).
			for _, wr := range res.pipe.ranks {
				for _, sp := range wr.spans {
					d := sp.end - sp.start
					switch k := sp.op.Kind; {
					case k == parallel.PipeInput && sp.op.Stage == 0:
						if d != 0 {
							t.Errorf("%+v: stage 0's input pass takes %g s", l, d)
						}
					case (k == parallel.PipeInput || k == parallel.PipeWeight) && !(d > 0):
						t.Errorf("%+v: %s of stage %d takes %g s", l, k, sp.op.Stage, d)
					}
				}
			}
		}
		mem, err := memoryEstimateFor(in)
		if err != nil {
			t.Fatal(err)
		}
		if res.PeakReservedBytes != mem {
			t.Errorf("%+v: peak reserved %d, memory.Estimate's worst stage %d", l, res.PeakReservedBytes, mem)
		}
		var buf strings.Builder
		if err := res.WriteTrace(&buf, nil); err != nil {
			t.Fatal(err)
		}
		for r := range l.PP {
			if !strings.Contains(buf.String(), fmt.Sprintf(`"name":"pp rank %d (stages`, r)) {
				t.Errorf("%+v: trace has no process for pp rank %d", l, r)
			}
		}
	}
}

func memoryEstimateFor(in Input) (int64, error) {
	rep, err := memory.Estimate(in.Model, in.Layout, memory.Batch{LBS: in.LBS, Seq: in.Seq, GradAccum: in.GradAccum}, in.MemoryOptions())
	return rep.Peak.Reserved, err
}

// TestSimulatePipelineTP: tensor parallelism inside pipeline stages. For
// the tiny 4-block MoE (hidden 8, KV heads 2) at pp 2 × tp 2 on 4 H100s,
// lbs 4 of 16 tokens in micro-batches of 1, by hand: a message is a tp
// rank's sequence shard, 16/2 tokens × 8 × 2 B = 128 B (256 B without
// tp); TPS = 4·16·accum tokens ÷ (pp · tp) per step (torchtitan's per-GPU
// share); the tp collectives run on NVLink on one HGX host and on the
// network when each host holds one GPU (the tp pair then spans two
// hosts), which makes the step longer; they are exposed, so the breakdown
// charges all_gather, reduce_scatter and all_reduce and its parts still
// sum to the step; and each stage's reduction runs the all-reduce of its
// replicated tensors' gradients (tp_grad_sync) once per micro-step.
func TestSimulatePipelineTP(t *testing.T) {
	cfg := pipelineConfig(4)
	cfg.KVHeads = 2
	dev, err := hw.LookupDevice("h100")
	if err != nil {
		t.Fatal(err)
	}
	run := func(perNode int) Result {
		l := job.Layout{GPUs: 4, PP: 2, TP: 2, GPUsPerNode: perNode}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		in := Input{Spec: job.Spec{Model: cfg, Layout: l, AC: moe.AC{Mode: moe.ACSelective}, Batch: job.Batch{LBS: 4, Seq: 16, GradAccum: 2}, Recipe: job.EagerRecipe()}, Device: dev, KeepTimeline: true}
		res, err := Simulate(in)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	nv, net := run(0), run(1)
	if nv.TPLink != "nvlink" || net.TPLink != "network" {
		t.Errorf("tp_link %q on HGX hosts, %q on hosts of one GPU; want nvlink and network", nv.TPLink, net.TPLink)
	}
	if !(net.StepTimeS > nv.StepTimeS) {
		t.Errorf("tp over the network: step %g s, not slower than over NVLink %g s", net.StepTimeS, nv.StepTimeS)
	}
	for _, r := range []Result{nv, net} {
		if r.Pipeline.MessageBytes != 128 {
			t.Errorf("message %d B, want 128", r.Pipeline.MessageBytes)
		}
		if want := 4.0 * 16 * 2 / (2 * 2) / r.StepTimeS; math.Abs(r.TPS-want) > 1e-9*want {
			t.Errorf("TPS %v, want %v", r.TPS, want)
		}
		b := r.Breakdown
		sum := b.ComputeS + b.RecomputeS + b.OptimizerS
		for _, v := range b.ExposedCommS {
			sum += v
		}
		if math.Abs(sum-r.StepTimeS) > 1e-9*r.StepTimeS {
			t.Errorf("breakdown sums to %g s, step %g s: %+v", sum, r.StepTimeS, b)
		}
		for _, k := range []parallel.CollKind{parallel.CollAllGather, parallel.CollReduceScatter, parallel.CollAllReduce} {
			if !(b.CommS[string(k)] > 0) || !(b.ComputeS > 0) {
				t.Errorf("breakdown: %s %g s of tp collectives, compute %g s", k, b.CommS[string(k)], b.ComputeS)
			}
		}
		syncs := 0
		for _, wr := range r.pipe.ranks {
			for _, sp := range wr.spans {
				if sp.op.Kind == parallel.PipeColl && sp.op.Coll.Purpose == parallel.PurposeTPGradSync {
					syncs++
				}
			}
		}
		// Stage 0: the embedding (none), blocks 0, 1; stage 1: blocks 2,
		// 3 and the head; two micro-steps.
		if syncs != 2*(2+3) {
			t.Errorf("%d tp gradient all-reduces, want 10", syncs)
		}
	}
}

// TestPipelineTPSecondsAsSchedule: the tp collectives a pipeline prices
// inside each stage's forward and backward are the single-program
// schedule's, priced alike. tp 2 alone on 2 GPUs runs one micro-batch of
// one sequence: the engine's spans of its tp collectives (the gradient
// all-reduces apart; nothing else communicates beside them) sum to S. pp 2
// × tp 2 runs the same layers split over two stages, M = 4 micro-batches of
// that shape: its ranks' tp seconds inside forwards and backwards sum to
// 4·S, within 1e-9.
func TestPipelineTPSecondsAsSchedule(t *testing.T) {
	cfg := pipelineConfig(4)
	cfg.KVHeads = 2
	dev, err := hw.LookupDevice("h100")
	if err != nil {
		t.Fatal(err)
	}
	sim := func(l job.Layout, lbs int) Result {
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		res, err := Simulate(Input{Spec: job.Spec{Model: cfg, Layout: l, AC: moe.AC{Mode: moe.ACFull}, Batch: job.Batch{LBS: lbs, Seq: 16}, Recipe: job.EagerRecipe()}, Device: dev, KeepTimeline: true})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	one := sim(job.Layout{GPUs: 2, TP: 2}, 1)
	var s float64
	for i, ot := range one.OpTimings() {
		if o := one.Schedule.Ops[i]; o.Type == parallel.OpCollective && o.Axis == parallel.AxisTP && o.Purpose != parallel.PurposeTPGradSync {
			s += ot.EndS - ot.StartS
		}
	}
	pp := sim(job.Layout{GPUs: 4, PP: 2, TP: 2}, 4)
	var got float64
	for _, wr := range pp.pipe.ranks {
		for _, v := range wr.tp {
			got += v
		}
		got -= wr.tpOutside
	}
	if !(s > 0) || math.Abs(got-4*s) > 1e-9*4*s {
		t.Errorf("pipeline tp seconds %g, want 4 × the schedule's %g = %g", got, s, 4*s)
	}
}
