package numeric

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/moetest"
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

func pipelineRun(t *testing.T, cfg *moe.Config, l moe.Layout, ac moe.AC, lbs, accum, steps int) ([]StepResult, [][]float32) {
	t.Helper()
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	init, err := moe.NewModel[float32](cfg)
	if err != nil {
		t.Fatal(err)
	}
	init.InitRandom(7) // numericRun's initialization, data seed and optimizer
	p, err := NewPipelineTrainer(PipelineSpec{Config: cfg, Layout: l, AC: ac, LBS: lbs, Seq: 4, Accum: accum, DataSeed: 11,
		AdamW: moe.AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}, AuxCoef: cfg.AuxLossCoef, BiasRate: 1e-3}, init.Tensors())
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

// TestPipelineEqualsOneRank: pp × dp_shard ranks (FSDP inside each stage
// when dp_shard > 1) running lbs L per micro-step in pipeline micro-batches
// of b sequences, grad-accum A, train 3 steps to the losses and parameters
// of one rank at lbs b with grad-accum A·dp_shard·L/b (the same
// micro-batches: PipelineTrainer's doc), within 1e-5 relative: one rank
// accumulates each micro-batch's gradient into its accumulator after the
// backward, a stage's blocks accumulate into it during the backward and
// FSDP sums the ranks' sums, so sums round differently.
func TestPipelineEqualsOneRank(t *testing.T) {
	for _, c := range []struct {
		layers int
		l      moe.Layout
		lbs    int
		accum  int
		ac     moe.AC
		bias   bool
		aux    string // "", "hf" (HF's loss over every layer) or "seq" (DeepSeek-MoE's per layer)
	}{
		{4, moe.Layout{GPUs: 2, PP: 2}, 4, 1, moe.AC{Mode: moe.ACSelective}, false, ""},
		{4, moe.Layout{GPUs: 4, PP: 4}, 8, 2, moe.AC{Mode: moe.ACNone}, false, ""},
		{4, moe.Layout{GPUs: 4, PP: 4, PPSchedule: moe.PPGPipe}, 4, 1, moe.AC{Mode: moe.ACFull}, false, ""},
		{6, moe.Layout{GPUs: 2, PP: 2, PPSchedule: moe.PPInterleaved1F1B, PPMicrobatchSize: 2}, 8, 1, moe.AC{Mode: moe.ACSelective}, false, ""},
		{4, moe.Layout{GPUs: 2, PP: 2, PPLayers: "3,1"}, 2, 2, moe.AC{Mode: moe.ACSelective}, true, ""},
		// FSDP inside the stages.
		{4, moe.Layout{GPUs: 4, PP: 2, DPShard: 2, Sharding: moe.ShardFSDP}, 2, 2, moe.AC{Mode: moe.ACSelective}, true, ""},
		{4, moe.Layout{GPUs: 8, PP: 4, DPShard: 2, Sharding: moe.ShardFSDP}, 4, 1, moe.AC{Mode: moe.ACNone}, false, ""},
		{6, moe.Layout{GPUs: 6, PP: 2, DPShard: 3, Sharding: moe.ShardFSDP, PPSchedule: moe.PPInterleaved1F1B}, 4, 1, moe.AC{Mode: moe.ACFull}, false, ""},
		// The aux loss across stages.
		{4, moe.Layout{GPUs: 4, PP: 4}, 4, 1, moe.AC{Mode: moe.ACSelective}, false, "hf"},
		{6, moe.Layout{GPUs: 4, PP: 2, DPShard: 2, Sharding: moe.ShardFSDP, PPSchedule: moe.PPInterleaved1F1B}, 4, 1, moe.AC{Mode: moe.ACNone}, false, "hf"},
		{4, moe.Layout{GPUs: 2, PP: 2, PPMicrobatchSize: 2}, 4, 2, moe.AC{Mode: moe.ACSelective}, false, "seq"},
		// Zero-bubble schedules: backward split into input and weight
		// passes, V placement for ZBVZeroBubble.
		{6, moe.Layout{GPUs: 2, PP: 2, PPSchedule: moe.PPZBVZeroBubble}, 4, 1, moe.AC{Mode: moe.ACSelective}, false, ""},
		{6, moe.Layout{GPUs: 2, PP: 2, PPSchedule: moe.PPZBVZeroBubble}, 2, 2, moe.AC{Mode: moe.ACFull}, true, "hf"},
		{6, moe.Layout{GPUs: 4, PP: 2, DPShard: 2, Sharding: moe.ShardFSDP, PPSchedule: moe.PPZBVZeroBubble}, 4, 1, moe.AC{Mode: moe.ACNone}, false, ""},
		{8, moe.Layout{GPUs: 4, PP: 4, PPSchedule: moe.PPZBVZeroBubble, PPLayers: "0,1,1,2,2,1,1,0"}, 8, 1, moe.AC{Mode: moe.ACSelective}, false, "seq"},
		{8, moe.Layout{GPUs: 8, PP: 4, DPShard: 2, Sharding: moe.ShardFSDP, PPSchedule: moe.PPZBVZeroBubble, PPLayers: "1,1,1,1,1,1,1,1"}, 7, 1, moe.AC{Mode: moe.ACSelective}, false, "hf"},
		{6, moe.Layout{GPUs: 2, PP: 2, PPSchedule: moe.PPInterleavedZeroBubble}, 4, 1, moe.AC{Mode: moe.ACSelective}, false, "hf"},
		{6, moe.Layout{GPUs: 4, PP: 2, DPShard: 2, Sharding: moe.ShardFSDP, PPSchedule: moe.PPInterleavedZeroBubble, PPMicrobatchSize: 2}, 4, 2, moe.AC{Mode: moe.ACSelective}, true, ""},
		// DualPipeV: full backwards, input and weight passes on one stage.
		{6, moe.Layout{GPUs: 2, PP: 2, PPSchedule: moe.PPDualPipeV}, 5, 1, moe.AC{Mode: moe.ACSelective}, false, "hf"},
		{6, moe.Layout{GPUs: 4, PP: 2, DPShard: 2, Sharding: moe.ShardFSDP, PPSchedule: moe.PPDualPipeV}, 4, 2, moe.AC{Mode: moe.ACFull}, true, ""},
		{8, moe.Layout{GPUs: 4, PP: 4, PPSchedule: moe.PPDualPipeV, PPLayers: "0,1,1,2,2,1,1,0"}, 8, 1, moe.AC{Mode: moe.ACNone}, false, "seq"},
		{4, moe.Layout{GPUs: 4, PP: 2, DPShard: 2, Sharding: moe.ShardFSDP}, 2, 1,
			moe.AC{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoEAct}, false, ""},
	} {
		cfg := pipelineModel(c.layers)
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
		name := fmt.Sprintf("pp %d %s dp_shard %d mbs %d lbs %d accum %d %s aux %q", c.l.PP, c.l.PPSchedule, c.l.DPShard, c.l.PPMicrobatchSize, c.lbs, c.accum, c.ac, c.aux)
		pr, pp := pipelineRun(t, cfg, c.l, c.ac, c.lbs, c.accum, 3)
		mbs := max(c.l.PPMicrobatchSize, 1)
		dp := max(c.l.DPShard, 1)
		or, op, _ := numericRun(t, cfg, moetest.FSDPLayout(t, 1, 1, 1), c.ac, mbs, c.accum*dp*c.lbs/mbs, 3)
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
		l    moe.Layout
		cfg  func(*moe.Config)
		want string
	}{
		{moe.Layout{GPUs: 8, PP: 2, DPReplicate: 2}, nil, "dp_replicate 2, ep 1, sharding fsdp inside a pipeline stage: not built"},
		{moe.Layout{GPUs: 4, PP: 2, EP: 2}, nil, "dp_replicate 1, ep 2, sharding fsdp inside a pipeline stage: not built"},
		{moe.Layout{GPUs: 4, PP: 2, Sharding: moe.ShardZeRO2}, nil, "sharding zero2 inside a pipeline stage: not built"},
		{moe.Layout{GPUs: 2, PP: 2}, func(c *moe.Config) { c.TiedEmbeddings = true }, "tied embeddings"},
		{moe.Layout{GPUs: 2, PP: 2, PPMicrobatchSize: 3}, nil, "lbs = 4 is not a multiple of pp_microbatch_size = 3"},
	} {
		l := c.l
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		cf := *cfg
		if c.cfg != nil {
			c.cfg(&cf)
		}
		init, _ := moe.NewModel[float32](&cf)
		_, err := NewPipelineTrainer(PipelineSpec{Config: &cf, Layout: l, LBS: 4, Seq: 4, Accum: 1, AdamW: moe.DefaultAdamW}, init.Tensors())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.l, err, c.want)
		}
	}
}
