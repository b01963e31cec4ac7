package plan_test

import (
	"fmt"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/plan"
)

// toyEvaluator stands in for parallel.SimEvaluator in this example: memory is
// 0.5 of the device for the model state over dp_shard plus 0.1 per
// sequence (halved under full checkpointing); TPS grows with the local
// batch, loses 2% per doubling of dp_shard and 10% under full checkpointing.
type toyEvaluator struct{}

func (toyEvaluator) MemoryFraction(p plan.Point) (float64, error) {
	act := 0.1
	if p.AC.Mode == moe.ACFull {
		act = 0.05
	}
	return 0.5/float64(p.Layout.DPShard) + act*float64(p.LBS), nil
}

func (e toyEvaluator) Evaluate(p plan.Point) (plan.Score, error) {
	m, _ := e.MemoryFraction(p)
	tps := 10000 * float64(p.LBS) / float64(p.LBS+1)
	for s := p.Layout.DPShard; s > 1; s /= 2 {
		tps *= 0.98
	}
	if p.AC.Mode == moe.ACFull {
		tps *= 0.9
	}
	return plan.Score{TPS: tps, MemoryFraction: m, StepTimeS: float64(p.LBS*4096) / tps, Bottleneck: "compute"}, nil
}

func ExampleSearch() {
	rep, err := plan.Search(plan.Request{
		GPUs: 64, GPUsPerNode: 8, Experts: 0, MemoryTarget: 0.92,
		ACs:       []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACFull}},
		Shardings: []job.Sharding{job.ShardFSDP},
	}, toyEvaluator{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, st := range rep.Stages {
		fmt.Printf("stage at %d GPUs: best %.0f TPS (%.1f%% of stage 1)\n", st.GPUs, st.BestTPS, 100*st.ScalingEfficiency)
	}
	fmt.Println("best:", rep.Best.Point)
	// By hand: without checkpointing lbs ≤ (0.92 − 0.5/s)/0.1, so dp_shard
	// s = 1, 2, 4, 8, 16 allow lbs 4, 6, 7, 8, 8 and give 10000·lbs/(lbs+1)
	// ·0.98^log2(s) = 8000, 8400, 8403.5, 8366, 8199 TPS; full checkpointing
	// peaks at s = 4, lbs 15: 10000·15/16·0.9604·0.9 = 8103. So dp_shard 4
	// at lbs 7 wins at every scale, and the rest of the GPUs are replicas.

	// Output:
	// stage at 8 GPUs: best 8404 TPS (100.0% of stage 1)
	// stage at 32 GPUs: best 8404 TPS (100.0% of stage 1)
	// stage at 64 GPUs: best 8404 TPS (100.0% of stage 1)
	// best: gpus=64 dp_shard=4 dp_replicate=16 ep=1 sharding=fsdp ac=none lbs=7 grad_accum=1
}
