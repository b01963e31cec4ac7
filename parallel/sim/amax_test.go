package sim

import (
	"testing"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// TestAmaxReduce: fp8-delayed's amax reductions are two blocking
// all-reduces per micro-batch, of 3 and 2 FP32 amaxes per converted GEMM
// (qwen3-30b-a3b at ep 8: 1632 GEMMs, job.Recipe.DelayedGEMMs), over the world
// without pp; nothing under another recipe or on one GPU.
func TestAmaxReduce(t *testing.T) {
	cfg, err := hf.Load("qwen3-30b-a3b")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := hw.LoadCluster("hgx")
	if err != nil {
		t.Fatal(err)
	}
	r := job.DefaultRecipe()
	r.Precision = job.FP8Delayed
	if err := r.Resolve(); err != nil {
		t.Fatal(err)
	}
	l := job.Layout{GPUs: 8, DPShard: 8, DPReplicate: 1, EP: 8, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	units, err := memory.Units(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	world := worldRanks(8)
	var want float64
	for _, bytes := range []float64{3 * 1632 * 4, 2 * 1632 * 4} {
		cc, err := cost.Collective(cl, nil, parallel.CollAllReduce, cost.ShapeOf(cl, world), bytes)
		if err != nil {
			t.Fatal(err)
		}
		want += cc.Seconds()
	}
	got, err := amaxReduceSeconds(cl, nil, r, cfg, l, units, world, 4)
	if err != nil || got != 4*want || !(got > 0) {
		t.Errorf("4 micro-batches: %g s (%v), want 4 × %g", got, err, want)
	}
	if one, _ := amaxReduceSeconds(cl, nil, r, cfg, l, units, world[:1], 4); one != 0 {
		t.Errorf("one GPU: %g s, want 0", one)
	}
	r.Precision = job.FP8Current
	if cur, _ := amaxReduceSeconds(cl, nil, r, cfg, l, units, world, 4); cur != 0 {
		t.Errorf("fp8-current: %g s, want 0 (no amax history)", cur)
	}
}
