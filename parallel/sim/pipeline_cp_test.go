package sim

import (
	"math"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// TestSimulatePipelineCP: Llama 3 8B (32 layers, 8 kv heads × head_dim
// 128, hidden 4096) on 32 H100s, pp 2 × dp_shard 2 × cp 4 × tp 2, 1F1B,
// lbs 4 of pp_microbatch_size 1, seq 32768, no checkpointing. Counted by
// hand:
//   - a pipeline message is one micro-batch's hidden states as a cp and tp
//     rank holds them: 32768/4/2 tokens × 4096 × 2 bytes = 33,554,432
//     (Megatron-LM d98e8a64 schedules.py get_tensor_shapes);
//   - one cp rank's K and V shard of a micro-batch is 8192 tokens × 8/2
//     kv heads × 128 × 2 (K, V) × 2 bytes = 16,777,216; the cp group,
//     ranks 0, 2, 4, 6, lies in one host (NVLink);
//   - under allgather each of the last rank's 16 layers runs, per
//     micro-batch (4), one all-gather of cp shards forward and one in
//     backward, and one reduce-scatter of dK/dV: comm_s holds 2·16·4 of
//     the first and 16·4 of the second, priced here by cost.Collective
//     directly;
//   - a rank's tokens per step are lbs·seq/cp/(pp·tp) (torchtitan's TPS
//     divides by pp as well, simulatePipeline).
func TestSimulatePipelineCP(t *testing.T) {
	in := cpInput(t, job.Layout{GPUs: 32, PP: 2, CP: 4, TP: 2, PPSchedule: job.PP1F1B}, 32768)
	in.LBS, in.AC = 4, moe.AC{Mode: moe.ACNone}
	res, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	if res.Pipeline == nil || res.Pipeline.MessageBytes != 33554432 {
		t.Fatalf("pipeline %+v, want messages of 33554432 bytes", res.Pipeline)
	}
	if res.CPLink != "nvlink" {
		t.Errorf("cp link %s, want nvlink", res.CPLink)
	}
	cl, err := hw.LoadCluster("hgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	g := cost.ShapeOf(cl, []int{0, 2, 4, 6})
	const shard = 16777216.0
	ag, err := cost.Collective(cl, nil, parallel.CollAllGather, g, 4*shard)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := cost.Collective(cl, nil, parallel.CollReduceScatter, g, 4*shard)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{"cp_all_gather_kv": 2 * 16 * 4 * ag.Seconds(), "cp_reduce_scatter_dkv": 16 * 4 * rs.Seconds()} {
		if got := res.Breakdown.CommS[name]; math.Abs(got/want-1) > 1e-9 {
			t.Errorf("comm_s[%s] = %v s, want %v", name, got, want)
		}
		if e := res.Breakdown.ExposedCommS[name]; e < 0 || e > res.Breakdown.CommS[name]*(1+1e-12) {
			t.Errorf("exposed %s = %v s of %v run", name, e, res.Breakdown.CommS[name])
		}
	}
	b := res.Breakdown
	sum := b.ComputeS + b.RecomputeS + b.OptimizerS
	for _, v := range b.ExposedCommS {
		sum += v
	}
	if math.Abs(sum/res.StepTimeS-1) > 1e-9 {
		t.Errorf("breakdown sums to %v s, step %v s", sum, res.StepTimeS)
	}
	tokens := 4 * 32768.0 / 4 / (2 * 2)
	if got := res.TPS * res.StepTimeS; math.Abs(got/tokens-1) > 1e-9 {
		t.Errorf("TPS × step time = %v tokens, want %v", got, tokens)
	}
}
