package sim

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
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
		s        moe.PPSchedule
		pp, v, m int
		f, b     float64
	}{
		{moe.PP1F1B, 4, 1, 8, 1, 2},
		{moe.PP1F1B, 2, 1, 2, 0.3, 0.6},
		{moe.PP1F1B, 8, 1, 16, 1, 1},
		{moe.PPGPipe, 4, 1, 8, 1, 2},
		{moe.PPGPipe, 3, 1, 6, 0.5, 1.5},
		{moe.PPInterleaved1F1B, 2, 2, 4, 1, 2},
		{moe.PPInterleaved1F1B, 4, 2, 8, 1, 2},
		{moe.PPInterleaved1F1B, 4, 3, 8, 1, 1},
		{moe.PPInterleaved1F1B, 4, 2, 4, 1, 2},
	} {
		name := fmt.Sprintf("%s pp %d v %d m %d f %g b %g", c.s, c.pp, c.v, c.m, c.f, c.b)
		l := moe.Layout{GPUs: c.pp, PP: c.pp, PPSchedule: c.s, PPVirtualStages: c.v, PPLayers: moe.NewStageLayers(ones(c.pp * c.v))}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		p, err := parallel.BuildPipeline(parallel.PipelineSpec{Config: pipelineConfig(c.pp * c.v), Layout: l, LBS: c.m, Seq: 4, Accum: 1, GPUsPerNode: 8})
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
		l    moe.Layout
		link string
	}{
		{moe.Layout{GPUs: 8, PP: 2, DPShard: 4, EP: 2}, "nvlink"},
		{moe.Layout{GPUs: 16, PP: 2, DPShard: 8}, "network"},
		{moe.Layout{GPUs: 8, PP: 2, DPShard: 2, DPReplicate: 2, PPSchedule: moe.PPInterleaved1F1B, PPLayers: "1,1,1,1"}, "nvlink"},
	} {
		l := c.l
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		const lbs, seq, accum = 4, 16, 2
		in := Input{Config: cfg, Layout: l, AC: moe.AC{Mode: moe.ACSelective}, LBS: lbs, Seq: seq, GradAccum: accum, Device: dev, KeepTimeline: true}
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
		for _, k := range pl.P2PLink {
			if k != c.link {
				t.Errorf("%+v: stage boundary on %s, want %s", l, k, c.link)
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
	rep, err := memory.Estimate(in.Config, in.Layout, memory.Batch{LBS: in.LBS, Seq: in.Seq, GradAccum: in.GradAccum}, in.memoryOptions())
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
		l := moe.Layout{GPUs: 4, PP: 2, TP: 2, GPUsPerNode: perNode}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		in := Input{Config: cfg, Layout: l, AC: moe.AC{Mode: moe.ACSelective}, LBS: 4, Seq: 16, GradAccum: 2, Device: dev, KeepTimeline: true}
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
	sim := func(l moe.Layout, lbs int) Result {
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		res, err := Simulate(Input{Config: cfg, Layout: l, AC: moe.AC{Mode: moe.ACFull}, LBS: lbs, Seq: 16, Device: dev, KeepTimeline: true})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	one := sim(moe.Layout{GPUs: 2, TP: 2}, 1)
	var s float64
	for i, ot := range one.OpTimings() {
		if o := one.Schedule.Ops[i]; o.Type == parallel.OpCollective && o.Axis == parallel.AxisTP && o.Purpose != parallel.PurposeTPGradSync {
			s += ot.EndS - ot.StartS
		}
	}
	pp := sim(moe.Layout{GPUs: 4, PP: 2, TP: 2}, 4)
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
