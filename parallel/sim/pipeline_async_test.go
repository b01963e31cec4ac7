package sim

import (
	"math"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// TestAsyncPassByHand: each stage's forward of one micro-batch, walked as the
// pipeline walks it under async TP (passTiming), against a critical path
// derived by hand. The tiny MoE (D = 8, 2 MoE blocks, KV heads 2) at pp 2 ×
// tp 2, one sequence of 8 tokens: stage 0 runs the embedding and block 0.
// Every compute segment takes c = 1 µs (embedding E, the block's attention
// half and router P, experts X, residual R; no expert parallelism); the
// cluster has no latency and 1 GB/s of NVLink, so a tp collective of S =
// 8 × 8 bf16 = 128 B moves (n−1)/n·S = 64 B, W = 64 ns, and each of its
// two chunks w = 32 ns alone; collectives moving bytes at once share the
// link equally; compute runs at full rate beside them.
//
// Without async TP the pass is a chain: E, the embedding's reduce-scatter,
// the all-gather before q/k/v, P, the o_proj reduce-scatter, the FFN
// all-gather, X, R, the MoE output's reduce-scatter: 4c + 5W = 4.320 µs,
// exposed reduce-scatters 3W and all-gathers 2W.
//
// With async TP each collective is a first chunk F on the compute stream
// and an overlapped part O on the side stream after it (tpColl); P waits
// for F2, X for F4 and O1, O2, R for X and O3, O4:
//
//	E [0, c]; F1 [c, c+w] alone;
//	F2 and O1 from c+w, sharing the link: both end at c+3w;
//	O2 [c+3w, c+4w] beside P [c+3w, 2c+3w];
//	F3 [2c+3w, 2c+4w] alone; F4 and O3 from 2c+4w, sharing: end 2c+6w;
//	O4 [2c+6w, 2c+7w] beside X [2c+6w, 3c+6w] (O1, O2 long done);
//	R [3c+6w, 4c+6w] (O3, O4 done); F5 [4c+6w, 4c+7w]; O5 [4c+7w, 4c+8w].
//
// The pass ends with O5: 4c + 8w = 4c + 4W = 4.256 µs, W less than
// without async TP. Its exposed tp time is 8w: reduce-scatters F1, F3, F5
// and the wait for O5 (4w), all-gathers F2 and F4 (2w each, shared); they
// ran 8w (reduce-scatter: F1 w, O1 2w, F3 w, O3 2w, F5 w, O5 w) and 6w
// (all-gather: F2 2w, O2 w, F4 2w, O4 w).
//
// Stage 1's forward runs block 1 (P, X, R) and the head H, c each, with
// loss parallel's three all-reduces A of 8 f32 values after H, moving
// 2·(n−1)/n·32 = 32 B, w each, never split. Without async TP: 4c + 5W + 3w
// = 4c + 13w = 4.416 µs (all-gathers 3W, reduce-scatters 2W, all-reduces
// 3w). With async TP (the head's all-gather before H; X waits for O1, R
// for O2, O3, H for F5):
//
//	F1 [0, w]; O1 [w, 2w] beside P [w, c+w]; F2 [c+w, c+2w];
//	F3 and O2 from c+2w, sharing: end c+4w; O3 [c+4w, c+5w] beside
//	X [c+4w, 2c+4w]; R [2c+4w, 3c+4w]; F4 [3c+4w, 3c+5w];
//	F5 and O4 from 3c+5w, sharing: end 3c+7w; O5 [3c+7w, 3c+8w] beside
//	H [3c+7w, 4c+7w]; A, A, A [4c+7w, 4c+10w].
//
// 4c + 10w = 4.320 µs, 3w less; exposed all-gathers 5w (F1, F3, F5),
// reduce-scatters 2w, all-reduces 3w; ran 8w, 6w and 3w.
func TestAsyncPassByHand(t *testing.T) {
	cfg := moetest.TinyMoE()
	cfg.KVHeads = 2
	cl := &hw.Cluster{Name: "hand", GPUsPerNode: 8, NVLinkDomain: 8, NVLinkGBps: 1, NICsPerNode: 8, NICGbits: 8,
		NVLinkEfficiency: 1, NetEfficiency: 1}
	const c, w = 1e-6, 32e-9
	costs := map[segKey]segCost{}
	for _, k := range []segKey{{moe.LayerEmbed, parallel.SegEmbed, parallel.PhaseForward}, {cfg.LayerHead(), parallel.SegHead, parallel.PhaseForward}} {
		costs[k] = segCost{total: c}
	}
	for layer := range 2 {
		for _, seg := range []parallel.Segment{parallel.SegPre, parallel.SegExperts, parallel.SegPost} {
			costs[segKey{layer, seg, parallel.PhaseForward}] = segCost{total: c}
		}
	}
	// byKind is all-gather, reduce-scatter and all-reduce seconds in
	// tpKinds' order.
	byKind := func(ag, rs, ar float64) (x [len(tpKinds)]float64) {
		x[tpKind(parallel.CollAllGather)], x[tpKind(parallel.CollReduceScatter)], x[tpKind(parallel.CollAllReduce)] = ag, rs, ar
		return x
	}
	for _, x := range []struct {
		stage        int
		async        bool
		seconds      float64
		exposed, ran [len(tpKinds)]float64
	}{
		{0, false, 4*c + 5*2*w, byKind(2*2*w, 3*2*w, 0), byKind(2*2*w, 3*2*w, 0)},
		{0, true, 4*c + 8*w, byKind(4*w, 4*w, 0), byKind(6*w, 8*w, 0)},
		{1, false, 4*c + 13*w, byKind(3*2*w, 2*2*w, 3*w), byKind(3*2*w, 2*2*w, 3*w)},
		{1, true, 4*c + 10*w, byKind(5*w, 2*w, 3*w), byKind(8*w, 6*w, 3*w)},
	} {
		l := job.Layout{GPUs: 4, PP: 2, TP: 2, AsyncTP: x.async}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		pl, err := parallel.BuildPipeline(parallel.PipelineSpec{Spec: job.Spec{Model: cfg, Layout: l, Batch: job.Batch{LBS: 1, Seq: 8, GradAccum: 1}, Recipe: job.EagerRecipe()}, GPUsPerNode: 8})
		if err != nil {
			t.Fatal(err)
		}
		ops, err := pl.StagePass(cfg, x.stage, 8, moe.AC{Mode: moe.ACSelective}, moe.Precision{}, false)
		if err != nil {
			t.Fatal(err)
		}
		got, err := passTiming(ops, cl, pl.Stage, cost.ShapeOf(cl, []int{0, 1}), Input{Spec: job.Spec{Model: cfg, Recipe: job.EagerRecipe()}}, cost.ComputeSpec{}, costs, nil, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !near(got.seconds, x.seconds, 1e-12) {
			t.Errorf("stage %d async %v: pass %.6g s, want %.6g s", x.stage, x.async, got.seconds, x.seconds)
		}
		for k := range tpKinds {
			if !near(got.tp.exposed[k], x.exposed[k], 1e-9) || !near(got.tp.ran[k], x.ran[k], 1e-9) {
				t.Errorf("stage %d async %v: %s exposed %.4g s, ran %.4g s; want %.4g s, %.4g s", x.stage, x.async, tpKinds[k], got.tp.exposed[k], got.tp.ran[k], x.exposed[k], x.ran[k])
			}
		}
	}
}

// TestAsyncPassesWithoutAsyncAreSums: walked on the engine without async
// TP, a stage's passes are the chains the pipeline sums (pipelinePrices):
// the same forward, backward and backward-input seconds and the same tp
// seconds, within 1e-12, for the tiny 4-block MoE at pp 2 × tp 2, with and
// without expert parallelism, under none, selective, full and the modules
// policy's moe (the MoE layer re-run before its backward), single-stage and
// zero-bubble: the passes hold every segment, all-to-all and tp
// collective the sums count, and no other.
func TestAsyncPassesWithoutAsyncAreSums(t *testing.T) {
	cfg := pipelineConfig(4)
	cfg.KVHeads = 2
	dev, err := hw.LookupDevice("h100")
	if err != nil {
		t.Fatal(err)
	}
	for _, sch := range []job.PPSchedule{job.PP1F1B, job.PPZBVZeroBubble} {
		for _, ep := range []int{1, 2} {
			for _, ac := range []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}, {Mode: moe.ACModules, Modules: moe.RecomputeMoE}} {
				l := job.Layout{GPUs: 4, PP: 2, TP: 2, EP: ep, PPSchedule: sch}
				if err := l.Resolve(); err != nil {
					t.Fatal(err)
				}
				in := Input{Spec: job.Spec{Model: cfg, Layout: l, AC: ac, Batch: job.Batch{LBS: 4, Seq: 16, GradAccum: 1}, Recipe: job.EagerRecipe()}, Device: dev}
				su, err := setupPipeline(in)
				if err != nil {
					t.Fatal(err)
				}
				pc, _, err := pipelinePrices(su.pl, cfg, su.cl, in, su.inMB, su.spec, su.costs, su.loads, su.mo)
				if err != nil {
					t.Fatal(err)
				}
				walked := pc
				walked.fwd, walked.bwd = make([]float64, len(pc.fwd)), make([]float64, len(pc.bwd))
				walked.tpFwd, walked.tpBwd = make([]tpSeconds, len(pc.fwd)), make([]tpSeconds, len(pc.fwd))
				if err := asyncPasses(&walked, su.pl, cfg, su.cl, su.inMB, su.spec, su.costs, su.loads, tpShape(su.cl, su.pl)); err != nil {
					t.Fatal(err)
				}
				for s := range pc.fwd {
					want := []float64{pc.fwd[s], pc.bwd[s]}
					got := []float64{walked.fwd[s], walked.bwd[s]}
					if sch.ZeroBubble() && s > 0 {
						want, got = append(want, pc.bwd[s]-pc.wgt[s]), append(got, walked.inp[s])
					}
					for k := range tpKinds {
						want = append(want, pc.tpFwd[s].exposed[k], pc.tpBwd[s].exposed[k], pc.tpFwd[s].ran[k], pc.tpBwd[s].ran[k])
						got = append(got, walked.tpFwd[s].exposed[k], walked.tpBwd[s].exposed[k], walked.tpFwd[s].ran[k], walked.tpBwd[s].ran[k])
					}
					for i := range want {
						if !near(got[i], want[i], 1e-12) && math.Abs(got[i]-want[i]) > 1e-18 {
							t.Errorf("%s ep %d %s stage %d: walked %v, summed %v (entry %d)", sch, ep, ac, s, got, want, i)
							break
						}
					}
				}
			}
		}
	}
}

// TestSimulatePipelineAsyncTP: async TP inside pipeline stages hides part
// of the tp collectives. Llama 3 8B at pp 2 × tp 2 on 4 H100s of one HGX
// host (NVLink), lbs 2 of 4096 tokens, compiled, under 1F1B and the
// zero-bubble schedules: the step is shorter than without async TP and
// the tp collectives' exposed seconds fewer, the FLOPs per token are the
// same (MFU ÷ TPS), the breakdown's parts still sum to the step, and the
// memory is unchanged (moescope models no symmetric-memory buffer for
// async TP, with or without pp), and the exactness line says how the
// stages were walked. Eager, async TP is refused naming
// async_tp, tp, pp and compile, as torchtitan refuses it.
func TestSimulatePipelineAsyncTP(t *testing.T) {
	cfg, err := hf.Load("llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := hw.LookupDevice("h100")
	if err != nil {
		t.Fatal(err)
	}
	run := func(sch job.PPSchedule, async, compile bool) (Result, error) {
		l := job.Layout{GPUs: 4, PP: 2, TP: 2, AsyncTP: async, PPSchedule: sch}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		return Simulate(Input{Spec: job.Spec{Model: cfg, Layout: l, AC: moe.AC{Mode: moe.ACSelective}, Batch: job.Batch{LBS: 2, Seq: 4096}, Recipe: recipe(compile)}, Device: dev})
	}
	tpExposed := func(r Result) float64 {
		return r.Breakdown.ExposedCommS[string(parallel.CollAllGather)] + r.Breakdown.ExposedCommS[string(parallel.CollReduceScatter)]
	}
	for _, sch := range []job.PPSchedule{job.PP1F1B, job.PPInterleavedZeroBubble, job.PPZBVZeroBubble} {
		sync, err := run(sch, false, true)
		if err != nil {
			t.Fatal(err)
		}
		async, err := run(sch, true, true)
		if err != nil {
			t.Fatal(err)
		}
		if !(async.StepTimeS < sync.StepTimeS) || !(tpExposed(async) < tpExposed(sync)) {
			t.Errorf("%s: async TP step %g s (tp exposed %g s), without %g s (%g s); want both shorter", sch, async.StepTimeS, tpExposed(async), sync.StepTimeS, tpExposed(sync))
		}
		if !near(async.MFU/async.TPS, sync.MFU/sync.TPS, 1e-12) || async.PeakReservedBytes != sync.PeakReservedBytes {
			t.Errorf("%s: MFU/TPS %g vs %g, peak reserved %d vs %d B; want the same", sch, async.MFU/async.TPS, sync.MFU/sync.TPS, async.PeakReservedBytes, sync.PeakReservedBytes)
		}
		if !strings.Contains(async.Exactness, "async TP: each stage's forward and backward walked on the step engine") || strings.Contains(sync.Exactness, "async TP") {
			t.Errorf("%s: exactness %q with async TP, %q without", sch, async.Exactness, sync.Exactness)
		}
		b := async.Breakdown
		sum := b.ComputeS + b.RecomputeS + b.OptimizerS
		for _, v := range b.ExposedCommS {
			sum += v
		}
		if !near(sum, async.StepTimeS, 1e-9) || !(b.ComputeS > 0) {
			t.Errorf("%s: breakdown sums to %g s, step %g s: %+v", sch, sum, async.StepTimeS, b)
		}
		for _, k := range []parallel.CollKind{parallel.CollAllGather, parallel.CollReduceScatter} {
			if !(b.CommS[string(k)] > b.ExposedCommS[string(k)]) {
				t.Errorf("%s: %s ran %g s, exposed %g s; want part of it overlapped", sch, k, b.CommS[string(k)], b.ExposedCommS[string(k)])
			}
		}
	}
	_, err = run(job.PP1F1B, true, false)
	for _, w := range []string{"async_tp", "tp = 2", "pp = 2", "requires compile"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("eager async TP with pp: %v; want an error containing %q", err, w)
		}
	}
}

// recipe is torchtitan's, compiled or eager.
func recipe(compile bool) job.Recipe {
	r := job.DefaultRecipe()
	r.Compile = compile
	return r
}
