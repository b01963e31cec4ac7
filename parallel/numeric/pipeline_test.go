package numeric

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// pipelineModel is moetest's tiny MoE with layers blocks, alternating MoE
// and dense, without the aux loss (the cases turn it on).
func pipelineModel(layers int) *moe.Config {
	kinds := make([]bool, layers)
	for i := range kinds {
		kinds[i] = i%2 == 0
	}
	c := moetest.TinyMoELayers(kinds...)
	c.AuxLossCoef, c.OutputRouterLogits = 0, false
	return c
}

func pipelineRun(t *testing.T, cfg *moe.Config, l job.Layout, ac moe.AC, lbs, seq, accum, steps int) ([]StepResult, [][]float32) {
	t.Helper()
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	init, err := ref.NewModel[float32](cfg)
	if err != nil {
		t.Fatal(err)
	}
	init.InitRandom(7) // numericRun's initialization, data seed and optimizer
	p, err := NewPipelineTrainer(PipelineSpec{Spec: job.Spec{Model: cfg, Layout: l, AC: ac, Batch: job.Batch{LBS: lbs, Seq: seq, GradAccum: accum}, Recipe: job.EagerRecipe()}, DataSeed: 11, AdamW: ref.AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}, AuxCoef: cfg.AuxLossCoef, BiasRate: 1e-3}, init.Tensors())
	if err != nil {
		t.Fatal(err)
	}
	var res []StepResult
	for range steps {
		r, err := p.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		res = append(res, r)
	}
	return res, p.Params()
}

// TestPipelineEqualsOneRank: pp × dp_replicate × dp_shard × tp ranks
// (FSDP inside each stage when dp_shard > 1, HSDP with replicas, expert
// parallelism over dp_shard when ep > 1, tensor parallelism when tp > 1,
// whose ranks share their data-parallel rank's sequences, and both, EP
// borrowing dp_shard × tp at etp 1 or dp_shard at etp = tp) running lbs L per
// micro-step in pipeline micro-batches
// of b sequences, grad-accum A, train 3 steps to the losses and parameters
// of one rank at lbs b with grad-accum A·dp_replicate·dp_shard·L/b (the same
// micro-batches: PipelineTrainer's doc), within 1e-5 relative: one rank
// accumulates each micro-batch's gradient into its accumulator after the
// backward, a stage's blocks accumulate into it during the backward and
// FSDP sums the ranks' sums, so sums round differently.
func TestPipelineEqualsOneRank(t *testing.T) {
	for _, c := range []struct {
		layers int
		l      job.Layout
		lbs    int
		accum  int
		ac     moe.AC
		bias   bool
		aux    string // "", "hf" (HF's loss over every layer) or "seq" (DeepSeek-MoE's per layer)
	}{
		{4, job.Layout{GPUs: 2, PP: 2}, 4, 1, moe.AC{Mode: moe.ACSelective}, false, ""},
		{4, job.Layout{GPUs: 4, PP: 4}, 8, 2, moe.AC{Mode: moe.ACNone}, false, ""},
		{4, job.Layout{GPUs: 4, PP: 4, PPSchedule: job.PPGPipe}, 4, 1, moe.AC{Mode: moe.ACFull}, false, ""},
		{6, job.Layout{GPUs: 2, PP: 2, PPSchedule: job.PPInterleaved1F1B, PPMicrobatchSize: 2}, 8, 1, moe.AC{Mode: moe.ACSelective}, false, ""},
		{4, job.Layout{GPUs: 2, PP: 2, PPLayers: "3,1"}, 2, 2, moe.AC{Mode: moe.ACSelective}, true, ""},
		// FSDP inside the stages.
		{4, job.Layout{GPUs: 4, PP: 2, DPShard: 2, Sharding: job.ShardFSDP}, 2, 2, moe.AC{Mode: moe.ACSelective}, true, ""},
		{4, job.Layout{GPUs: 8, PP: 4, DPShard: 2, Sharding: job.ShardFSDP}, 4, 1, moe.AC{Mode: moe.ACNone}, false, ""},
		{6, job.Layout{GPUs: 6, PP: 2, DPShard: 3, Sharding: job.ShardFSDP, PPSchedule: job.PPInterleaved1F1B}, 4, 1, moe.AC{Mode: moe.ACFull}, false, ""},
		// The aux loss across stages.
		{4, job.Layout{GPUs: 4, PP: 4}, 4, 1, moe.AC{Mode: moe.ACSelective}, false, "hf"},
		{6, job.Layout{GPUs: 4, PP: 2, DPShard: 2, Sharding: job.ShardFSDP, PPSchedule: job.PPInterleaved1F1B}, 4, 1, moe.AC{Mode: moe.ACNone}, false, "hf"},
		{4, job.Layout{GPUs: 2, PP: 2, PPMicrobatchSize: 2}, 4, 2, moe.AC{Mode: moe.ACSelective}, false, "seq"},
		// Tensor parallelism inside the stages (sequence parallelism, the
		// stages exchanging each tp rank's sequence shard), alone, with
		// FSDP, with an interleaved schedule, the aux losses and the
		// selection bias.
		{4, job.Layout{GPUs: 4, PP: 2, TP: 2}, 4, 1, moe.AC{Mode: moe.ACSelective}, false, ""},
		{4, job.Layout{GPUs: 8, PP: 2, DPShard: 2, TP: 2, Sharding: job.ShardFSDP}, 2, 2, moe.AC{Mode: moe.ACNone}, true, ""},
		{6, job.Layout{GPUs: 4, PP: 2, TP: 2, PPSchedule: job.PPInterleaved1F1B}, 4, 1, moe.AC{Mode: moe.ACFull}, false, "hf"},
		{4, job.Layout{GPUs: 8, PP: 4, TP: 2, PPMicrobatchSize: 2}, 4, 1, moe.AC{Mode: moe.ACSelective}, false, "seq"},
		{4, job.Layout{GPUs: 4, PP: 2, TP: 2, PPSchedule: job.PPInterleaved1F1B, PPLayers: "1,1,1,1"}, 4, 1,
			moe.AC{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoEAct}, false, "hf"}, // Megatron's recompute modules, as R140 and R143
		{4, job.Layout{GPUs: 4, PP: 2, TP: 2, PPSchedule: job.PPInterleaved1F1B, PPLayers: "1,1,1,1"}, 4, 1,
			moe.AC{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoE}, false, "hf"}, // and as R145
		{4, job.Layout{GPUs: 4, PP: 2, DPShard: 2, Sharding: job.ShardFSDP}, 2, 1,
			moe.AC{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoEAct}, false, ""},
		// Zero-bubble schedules: backward split into input and weight
		// passes, V placement for ZBVZeroBubble.
		{6, job.Layout{GPUs: 2, PP: 2, PPSchedule: job.PPZBVZeroBubble}, 4, 1, moe.AC{Mode: moe.ACSelective}, false, ""},
		{6, job.Layout{GPUs: 2, PP: 2, PPSchedule: job.PPZBVZeroBubble}, 2, 2, moe.AC{Mode: moe.ACFull}, true, "hf"},
		{6, job.Layout{GPUs: 4, PP: 2, DPShard: 2, Sharding: job.ShardFSDP, PPSchedule: job.PPZBVZeroBubble}, 4, 1, moe.AC{Mode: moe.ACNone}, false, ""},
		{8, job.Layout{GPUs: 4, PP: 4, PPSchedule: job.PPZBVZeroBubble, PPLayers: "0,1,1,2,2,1,1,0"}, 8, 1, moe.AC{Mode: moe.ACSelective}, false, "seq"},
		{8, job.Layout{GPUs: 8, PP: 4, DPShard: 2, Sharding: job.ShardFSDP, PPSchedule: job.PPZBVZeroBubble, PPLayers: "1,1,1,1,1,1,1,1"}, 7, 1, moe.AC{Mode: moe.ACSelective}, false, "hf"},
		{6, job.Layout{GPUs: 2, PP: 2, PPSchedule: job.PPInterleavedZeroBubble}, 4, 1, moe.AC{Mode: moe.ACSelective}, false, "hf"},
		{6, job.Layout{GPUs: 4, PP: 2, DPShard: 2, Sharding: job.ShardFSDP, PPSchedule: job.PPInterleavedZeroBubble, PPMicrobatchSize: 2}, 4, 2, moe.AC{Mode: moe.ACSelective}, true, ""},
		// DualPipeV: full backwards, input and weight passes on one stage.
		{6, job.Layout{GPUs: 2, PP: 2, PPSchedule: job.PPDualPipeV}, 5, 1, moe.AC{Mode: moe.ACSelective}, false, "hf"},
		{6, job.Layout{GPUs: 4, PP: 2, DPShard: 2, Sharding: job.ShardFSDP, PPSchedule: job.PPDualPipeV}, 4, 2, moe.AC{Mode: moe.ACFull}, true, ""},
		{8, job.Layout{GPUs: 4, PP: 4, PPSchedule: job.PPDualPipeV, PPLayers: "0,1,1,2,2,1,1,0"}, 8, 1, moe.AC{Mode: moe.ACNone}, false, "seq"},
		// Zero-bubble schedules with tp inside the stages.
		{6, job.Layout{GPUs: 4, PP: 2, TP: 2, PPSchedule: job.PPZBVZeroBubble}, 4, 1, moe.AC{Mode: moe.ACSelective}, true, "hf"},
		{6, job.Layout{GPUs: 8, PP: 2, DPShard: 2, TP: 2, PPSchedule: job.PPDualPipeV}, 4, 1, moe.AC{Mode: moe.ACFull}, false, ""},
		{6, job.Layout{GPUs: 4, PP: 2, TP: 2, PPSchedule: job.PPInterleavedZeroBubble}, 4, 1, moe.AC{Mode: moe.ACNone}, false, "seq"},
		// Expert parallelism inside the stages, borrowing dp_shard (the
		// experts FSDP-chunked over efsdp when dp_shard > ep), with every
		// schedule kind: 1F1B, GPipe, interleaved, and the zero-bubble ones
		// (the experts' weight gradients queued in the input pass).
		{4, job.Layout{GPUs: 4, PP: 2, DPShard: 2, EP: 2}, 2, 2, moe.AC{Mode: moe.ACSelective}, true, ""},
		{6, job.Layout{GPUs: 4, PP: 2, DPShard: 2, EP: 2, PPSchedule: job.PPInterleaved1F1B}, 4, 1, moe.AC{Mode: moe.ACFull}, false, "hf"},
		{4, job.Layout{GPUs: 8, PP: 2, DPShard: 4, EP: 2}, 2, 1, moe.AC{Mode: moe.ACNone}, true, "seq"},
		{4, job.Layout{GPUs: 8, PP: 4, DPShard: 2, EP: 2, PPSchedule: job.PPGPipe}, 4, 1, moe.AC{Mode: moe.ACSelective}, false, "hf"},
		{6, job.Layout{GPUs: 4, PP: 2, DPShard: 2, EP: 2, PPSchedule: job.PPZBVZeroBubble}, 4, 1, moe.AC{Mode: moe.ACSelective}, true, "hf"},
		{6, job.Layout{GPUs: 4, PP: 2, DPShard: 2, EP: 2, PPSchedule: job.PPInterleavedZeroBubble}, 4, 1, moe.AC{Mode: moe.ACFull}, false, ""},
		{6, job.Layout{GPUs: 4, PP: 2, DPShard: 2, EP: 2, PPSchedule: job.PPDualPipeV}, 4, 1, moe.AC{Mode: moe.ACNone}, false, "seq"},
		// Replicas inside the stages (HSDP: the replicate all-reduce after
		// the dp_shard reduce-scatter), alone, with FSDP and EP, with tp,
		// under a zero-bubble schedule.
		{4, job.Layout{GPUs: 4, PP: 2, DPReplicate: 2}, 2, 2, moe.AC{Mode: moe.ACSelective}, true, ""},
		{6, job.Layout{GPUs: 8, PP: 2, DPReplicate: 2, DPShard: 2, EP: 2, PPSchedule: job.PPInterleaved1F1B}, 2, 1, moe.AC{Mode: moe.ACNone}, true, "hf"},
		{4, job.Layout{GPUs: 8, PP: 2, DPReplicate: 2, TP: 2}, 4, 1, moe.AC{Mode: moe.ACSelective}, false, "seq"},
		{6, job.Layout{GPUs: 8, PP: 2, DPReplicate: 2, DPShard: 2, PPSchedule: job.PPZBVZeroBubble}, 2, 1, moe.AC{Mode: moe.ACFull}, false, "hf"},
		// tp × ep inside the stages, on the stage mesh's placement
		// (parallel.Mesh). At etp 1 EP borrows dp_shard × tp: whole experts,
		// each tp rank routing its 1/tp of the tokens; with tp 2 the EP
		// group is the tp group, with ep 4 over dp_shard 2 × tp 2 it spans
		// both, and with tp 4 × ep 2 efsdp spans the tp ranks {0, 2} and
		// {1, 3}, whose expert gradients it sums. At etp = tp EP borrows
		// dp_shard only and each expert is split over tp. Every schedule,
		// FSDP and replicas.
		{4, job.Layout{GPUs: 4, PP: 2, TP: 2, EP: 2}, 4, 1, moe.AC{Mode: moe.ACSelective}, true, "hf"},
		{4, job.Layout{GPUs: 8, PP: 2, DPShard: 2, TP: 2, EP: 2, PPMicrobatchSize: 2}, 4, 1, moe.AC{Mode: moe.ACNone}, false, "seq"},
		{4, job.Layout{GPUs: 8, PP: 2, DPShard: 2, TP: 2, EP: 4, PPSchedule: job.PPGPipe}, 2, 2, moe.AC{Mode: moe.ACFull}, true, ""},
		{4, job.Layout{GPUs: 8, PP: 2, TP: 4, EP: 2}, 2, 1, moe.AC{Mode: moe.ACSelective}, false, "hf"},
		{6, job.Layout{GPUs: 4, PP: 2, TP: 2, EP: 2, PPSchedule: job.PPZBVZeroBubble}, 4, 1, moe.AC{Mode: moe.ACSelective}, false, "hf"},
		{6, job.Layout{GPUs: 8, PP: 2, DPReplicate: 2, TP: 2, EP: 2, PPSchedule: job.PPDualPipeV}, 4, 1, moe.AC{Mode: moe.ACSelective}, true, "hf"},
		{6, job.Layout{GPUs: 8, PP: 2, DPShard: 2, TP: 2, EP: 2, ETP: 2, PPSchedule: job.PPInterleaved1F1B}, 4, 1, moe.AC{Mode: moe.ACFull}, false, "seq"},
		{6, job.Layout{GPUs: 8, PP: 2, DPShard: 2, TP: 2, EP: 2, ETP: 2, PPSchedule: job.PPInterleavedZeroBubble}, 4, 1, moe.AC{Mode: moe.ACNone}, true, ""},
		{4, job.Layout{GPUs: 4, PP: 2, TP: 2, EP: 2, PPSchedule: job.PPInterleaved1F1B, PPLayers: "1,1,1,1"}, 4, 1,
			moe.AC{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoEAct}, false, "hf"}, // R140's shape: tp 2 × ep, interleaved, Megatron's recompute modules
	} {
		cfg := pipelineModel(c.layers)
		seq := 4
		switch c.l.TP {
		case 2:
			cfg.KVHeads = 2 // tp 2 must divide the KV heads
		case 4:
			// tp 4 must divide the heads and the FFN widths, and seq by 2·tp.
			cfg.Heads, cfg.KVHeads, cfg.DenseFFN, cfg.ExpertFFN = 4, 4, 8, 8
			seq = 8
		}
		if c.bias {
			cfg.Score, cfg.SelectionBias, cfg.RoutedScale = moe.Sigmoid, true, 2.5
			cfg.Groups, cfg.TopKGroups = 2, 1
		}
		if c.aux != "" {
			cfg.AuxLossCoef, cfg.OutputRouterLogits, cfg.SeqAuxLoss = 0.01, true, c.aux == "seq"
		}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("pp %d %s dp_replicate %d dp_shard %d tp %d ep %d etp %d mbs %d lbs %d accum %d %s aux %q", c.l.PP, c.l.PPSchedule, c.l.DPReplicate, c.l.DPShard, c.l.TP, c.l.EP, c.l.ETP, c.l.PPMicrobatchSize, c.lbs, c.accum, c.ac, c.aux)
		pr, pp := pipelineRun(t, cfg, c.l, c.ac, c.lbs, seq, c.accum, 3)
		mbs := max(c.l.PPMicrobatchSize, 1)
		dp := max(c.l.DPReplicate, 1) * max(c.l.DPShard, 1)
		or, op, _ := numericRunSeq(t, cfg, moetest.FSDPLayout(t, 1, 1, 1), c.ac, mbs, seq, c.accum*dp*c.lbs/mbs, 3)
		compareRuns(t, name, or, pr, op, pp, false, 1e-5)
		for s := range or {
			if d := pr[s].Loss - or[s].Loss; d*d > 1e-10*or[s].Loss*or[s].Loss {
				t.Errorf("%s step %d: loss %.9g, one rank %.9g", name, s, pr[s].Loss, or[s].Loss)
			}
			if c.aux != "" && !(pr[s].Aux > 0) {
				t.Errorf("%s step %d: aux %v, want it computed", name, s, pr[s].Aux)
			}
		}
	}
}

func TestPipelineTrainerRefuses(t *testing.T) {
	cfg := pipelineModel(4)
	for _, c := range []struct {
		l    job.Layout
		cfg  func(*moe.Config)
		want string
	}{
		// What stays refused names every factor.
		{job.Layout{GPUs: 8, PP: 2, DPShard: 2, TP: 2, EP: 2, Sharding: job.ShardZeRO1}, nil,
			"sharding zero1 over dp_shard 2 inside a pipeline stage: not built (built: fsdp); gpus 8 = pp 2 × dp_replicate 1 × dp_shard 2 × tp 2, ep 2, etp 1"},
		{job.Layout{GPUs: 4, PP: 2, Sharding: job.ShardZeRO2}, nil, "sharding zero2 over dp_shard 2 inside a pipeline stage: not built (built: fsdp)"},
		{job.Layout{GPUs: 2, PP: 2}, func(c *moe.Config) { c.TiedEmbeddings = true }, "tied embeddings"},
		{job.Layout{GPUs: 2, PP: 2, PPMicrobatchSize: 3}, nil, "lbs = 4 is not a multiple of pp_microbatch_size = 3"},
	} {
		l := c.l
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		cf := *cfg
		if c.cfg != nil {
			c.cfg(&cf)
		}
		init, _ := ref.NewModel[float32](&cf)
		_, err := NewPipelineTrainer(PipelineSpec{Spec: job.Spec{Model: &cf, Layout: l, Batch: job.Batch{LBS: 4, Seq: 4, GradAccum: 1}, Recipe: job.EagerRecipe()}, AdamW: ref.DefaultAdamW}, init.Tensors())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.l, err, c.want)
		}
	}
}

// TestPipelineTPFollowsProgram: under tp inside pipeline stages every rank
// issues on its tp group exactly the pipeline program's tensor-parallel
// collectives, in its order: per forward and backward action the stage's
// parallel.Pipeline.StageTPCollectives (the forward's for a forward, the
// recompute's and backward's for a backward), and after a stage's last
// backward the all-reduces of its replicated tensors' gradients, one per
// unit in the program's reduction order. One micro-step (the trainer
// reduces once per step, the program once per micro-step), every policy
// (Megatron's recompute modules too), 1F1B and Interleaved1F1B, with FSDP,
// and with ep (the experts' all-to-alls are not on the tp group, etp 1 or
// tp alike).
func TestPipelineTPFollowsProgram(t *testing.T) {
	cfg := pipelineModel(4)
	cfg.KVHeads = 2
	for _, c := range []struct {
		l  job.Layout
		ac moe.AC
	}{
		{job.Layout{GPUs: 4, PP: 2, TP: 2}, moe.AC{Mode: moe.ACSelective}},
		{job.Layout{GPUs: 8, PP: 2, DPShard: 2, TP: 2}, moe.AC{Mode: moe.ACFull}},
		{job.Layout{GPUs: 4, PP: 2, TP: 2, PPSchedule: job.PPInterleaved1F1B, PPLayers: "1,1,1,1"}, moe.AC{Mode: moe.ACNone}},
		{job.Layout{GPUs: 4, PP: 2, TP: 2}, moe.AC{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoEAct}},
		{job.Layout{GPUs: 4, PP: 2, TP: 2, PPSchedule: job.PPZBVZeroBubble}, moe.AC{Mode: moe.ACSelective}},
		{job.Layout{GPUs: 8, PP: 2, DPShard: 2, TP: 2, PPSchedule: job.PPDualPipeV}, moe.AC{Mode: moe.ACFull}},
		{job.Layout{GPUs: 4, PP: 2, TP: 2, PPSchedule: job.PPInterleavedZeroBubble}, moe.AC{Mode: moe.ACNone}},
		// tp × ep: at etp 1 (the EP group the tp group) and at etp = tp.
		{job.Layout{GPUs: 4, PP: 2, TP: 2, EP: 2}, moe.AC{Mode: moe.ACSelective}},
		{job.Layout{GPUs: 8, PP: 2, DPShard: 2, TP: 2, EP: 2, ETP: 2, PPSchedule: job.PPZBVZeroBubble}, moe.AC{Mode: moe.ACFull}},
	} {
		l := c.l
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		const lbs, seq = 4, 4
		init, _ := ref.NewModel[float32](cfg)
		init.InitRandom(7)
		p, err := NewPipelineTrainer(PipelineSpec{Spec: job.Spec{Model: cfg, Layout: l, AC: c.ac, Batch: job.Batch{LBS: lbs, Seq: seq, GradAccum: 1}, Recipe: job.EagerRecipe()}, DataSeed: 11, AdamW: ref.DefaultAdamW}, init.Tensors())
		if err != nil {
			t.Fatal(err)
		}
		for _, cm := range p.comms {
			cm.Trace = true
		}
		if _, err := p.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
		prog, err := parallel.BuildPipeline(parallel.PipelineSpec{Spec: job.Spec{Model: cfg, Layout: l, Batch: job.Batch{LBS: lbs, Seq: seq, GradAccum: 1}, Recipe: job.EagerRecipe()}, GPUsPerNode: 8})
		if err != nil {
			t.Fatal(err)
		}
		act := moe.DefaultPrecision.Activation
		name := fmt.Sprintf("pp %d %s dp_shard %d tp %d %s", l.PP, l.PPSchedule, l.DPShard, l.TP, c.ac)
		for r, ops := range prog.Ranks {
			var want []collective.Record
			for _, o := range ops {
				// A backward's tp collectives run where its backward-data
				// does: a full backward, an input pass, stage 0's weight pass.
				bwd := o.Kind == parallel.PipeBackward || o.Kind == parallel.PipeInput && o.Stage > 0 || o.Kind == parallel.PipeWeight && o.Stage == 0
				switch {
				case o.Kind == parallel.PipeForward || bwd:
					for _, tc := range prog.StageTPCollectives(cfg, o.Stage, seq, c.ac, act) {
						if (tc.Phase == parallel.PhaseForward) == (o.Kind == parallel.PipeForward) {
							want = append(want, collective.Record{Kind: tc.Coll, Axis: parallel.AxisTP, DType: tc.DType, Elements: tc.Elements})
						}
					}
				case o.Kind == parallel.PipeColl:
					if o.Coll.Axis == parallel.AxisTP {
						want = append(want, collective.Record{Kind: o.Coll.Coll, Axis: parallel.AxisTP, DType: o.Coll.DType, Elements: o.Coll.Elements})
					}
				}
			}
			for lane, trace := range p.comms[r].Traces() {
				var got []collective.Record
				for _, x := range trace {
					if x.Axis == parallel.AxisTP {
						got = append(got, x)
					}
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%s pp rank %d lane %d: tp collectives\n%v\nthe program's\n%v", name, r, lane, got, want)
				}
			}
		}
	}
}

// TestPipelineTPEPPlacement: under tp × ep a stage's ranks hold the routed
// experts, pieces and groups torchtitan v0.2.2's sparse mesh gives them
// (73a0e69, torchtitan/distributed/parallel_dims.py: (pp, dp_replicate,
// efsdp, ep, etp) unflattened from the world, efsdp =
// dp_shard·tp/(etp·ep)), the placement parallel.Mesh gives the layout,
// memory and sim packages. Worked by hand for a stage of dp_shard 2 × tp
// 2, 4 experts over ep 2, from lane = shard·2 + tp rank = (efsdp index·ep
// + ep index)·etp + etp index:
//   - etp 1: etp index 0, ep index = lane mod 2, efsdp = lane / 2: lanes
//     0 and 2 hold experts 0 and 1 whole, lanes 1 and 3 experts 2 and 3;
//     EP groups {0, 1} and {2, 3} (each a tp group), efsdp {0, 2}, {1, 3};
//   - etp 2: etp index = lane mod 2 = the tp rank, ep index = lane / 2,
//     efsdp 1: lanes 0 and 1 hold experts 0 and 1, lanes 2 and 3 experts 2
//     and 3, each its tp rank's half of every expert; EP groups {0, 2} and
//     {1, 3}, efsdp one lane each.
func TestPipelineTPEPPlacement(t *testing.T) {
	cfg := pipelineModel(4)
	cfg.KVHeads = 2
	for _, c := range []struct {
		etp     int
		experts [4][]int // per lane, the routed experts of layer 0 it holds
		piece   [4]int   // per lane, its etp piece of them (of etp pieces)
		ep      [4][]int // per lane, its EP group
		efsdp   [4][]int // per lane, the group its expert chunks span
	}{
		{1, [4][]int{{0, 1}, {2, 3}, {0, 1}, {2, 3}}, [4]int{0, 0, 0, 0},
			[4][]int{{0, 1}, {0, 1}, {2, 3}, {2, 3}}, [4][]int{{0, 2}, {1, 3}, {0, 2}, {1, 3}}},
		{2, [4][]int{{0, 1}, {0, 1}, {2, 3}, {2, 3}}, [4]int{0, 1, 0, 1},
			[4][]int{{0, 2}, {1, 3}, {0, 2}, {1, 3}}, [4][]int{{0}, {1}, {2}, {3}}},
	} {
		l := job.Layout{GPUs: 8, PP: 2, DPShard: 2, TP: 2, EP: 2, ETP: c.etp}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		init, _ := ref.NewModel[float32](cfg)
		init.InitRandom(7)
		p, err := NewPipelineTrainer(PipelineSpec{Spec: job.Spec{Model: cfg, Layout: l, Batch: job.Batch{LBS: 4, Seq: 4, GradAccum: 1}, Recipe: job.EagerRecipe()}, AdamW: ref.DefaultAdamW}, init.Tensors())
		if err != nil {
			t.Fatal(err)
		}
		ps := cfg.Params()
		for lane, pr := range p.ranks[0] {
			var held []int
			for i, q := range ps {
				if q.Group != moe.GroupRouted || q.Layer != 0 || !pr.owned[i] {
					continue
				}
				if !slices.Contains(held, q.Expert) {
					held = append(held, q.Expert)
				}
				n, idx := tpSplit(l.StageLayout(), pr.coord, q)
				if n != c.etp || idx != c.piece[lane] {
					t.Errorf("etp %d lane %d: %s is piece %d of %d, want %d of %d", c.etp, lane, q.Name, idx, n, c.piece[lane], c.etp)
				}
				if whole := ref.TPShard(q, init.Tensors()[i], c.etp, c.piece[lane]); !slices.Equal(pr.model.Tensors()[i], whole) {
					t.Errorf("etp %d lane %d: %s holds another piece than %d of %d", c.etp, lane, q.Name, c.piece[lane], c.etp)
				}
				if g := pr.group[i].Ranks; !slices.Equal(g, c.efsdp[lane]) {
					t.Errorf("etp %d lane %d: %s chunked over %v, want %v", c.etp, lane, q.Name, g, c.efsdp[lane])
				}
			}
			if !slices.Equal(held, c.experts[lane]) {
				t.Errorf("etp %d lane %d: holds experts %v of layer 0, want %v", c.etp, lane, held, c.experts[lane])
			}
			if g := p.comms[0].Mesh().Group(parallel.AxisEP, lane).Ranks; !slices.Equal(g, c.ep[lane]) {
				t.Errorf("etp %d lane %d: EP group %v, want %v", c.etp, lane, g, c.ep[lane])
			}
		}
	}
}
