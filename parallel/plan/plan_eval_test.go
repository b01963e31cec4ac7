package plan

import (
	"testing"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// qwenOnB200 is the built-in Qwen3-30B-A3B and the B200 device.
func qwenOnB200(tb testing.TB) (*moe.Config, hw.Device) {
	tb.Helper()
	cfg, err := hf.Load("qwen3-30b-a3b")
	if err != nil {
		tb.Fatal(err)
	}
	dev, err := hw.LookupDevice("b200")
	if err != nil {
		tb.Fatal(err)
	}
	return cfg, dev
}

// benchPoint is the benchmarks' candidate: 512 GPUs, fsdp 64 × 8 replicas, ep 8.
var benchPoint = Point{Layout: job.Layout{GPUs: 512, DPShard: 64, DPReplicate: 8, EP: 8, Sharding: job.ShardFSDP,
	ReshardAfterForward: true}, AC: moe.AC{Mode: moe.ACSelective}, LBS: 2, GradAccum: 1}

func BenchmarkPlanSimMemory(b *testing.B) {
	cfg, dev := qwenOnB200(b)
	p := benchPoint
	for b.Loop() {
		e := &SimEvaluator{Model: cfg, Device: dev, Seq: 4096} // fresh: no cached results
		if _, err := e.MemoryFraction(p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlanSimEvaluate(b *testing.B) {
	cfg, dev := qwenOnB200(b)
	p := benchPoint
	for b.Loop() {
		e := &SimEvaluator{Model: cfg, Device: dev, Seq: 4096} // fresh: no cached results
		if _, err := e.Evaluate(p); err != nil {
			b.Fatal(err)
		}
	}
}

// planSmallDevice is a B200 with its memory cut so that the tiny model's
// memory limit binds inside the searched local batches, and nothing
// outside PyTorch's allocator (B200's gigabytes would fill it).
func planSmallDevice(t testing.TB, bytes int64) hw.Device {
	dev, err := hw.LookupDevice("b200")
	if err != nil {
		t.Fatal(err)
	}
	dev.Name, dev.MemoryBytes, dev.OutsideBytes, dev.OutsideEPBytes = "b200-small", bytes, 0, 0
	return dev
}

// TestPlanSimHierarchicalNearExhaustive is the check on the real
// evaluator (memory timeline + virtual-time backend): the hierarchical best
// is within 2% (TPS) of the exhaustive optimum, for each model and GPU
// count tried, with the number of candidates each simulated.
func TestPlanSimHierarchicalNearExhaustive(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		gpus, gb int
		mem      int64
		pps      []int
	}{{16, 64, 12 << 20, nil}, {16, 64, 12 << 20, []int{1, 2, 4}}} { // 12 MiB: none fits lbs ≈ 5, selective more, full ≈ 12 (8 searched)
		ev := &SimEvaluator{Model: cfg, Device: planSmallDevice(t, c.mem), Seq: 256}
		req := Request{GPUs: c.gpus, GPUsPerNode: 8, Experts: cfg.Experts, MemoryTarget: 0.92, GlobalBatch: c.gb, MaxLBS: 8, PPs: c.pps, Layers: cfg.Layers}
		hier, err := Search(req, ev)
		if err != nil {
			t.Fatalf("gpus %d: %v", c.gpus, err)
		}
		planCheckReport(t, req, hier)
		req.Exhaustive = true
		exh, err := Search(req, ev)
		if err != nil {
			t.Fatalf("gpus %d exhaustive: %v", c.gpus, err)
		}
		ratio := hier.Best.Score.TPS / exh.Best.Score.TPS
		t.Logf("tiny gpus=%d gb=%d pp %v: hierarchical %.0f TPS (%d simulated: %s), exhaustive %.0f TPS (%d simulated: %s), ratio %.4f",
			c.gpus, c.gb, c.pps, hier.Best.Score.TPS, hier.Simulated, hier.Best.Point, exh.Best.Score.TPS, exh.Simulated, exh.Best.Point, ratio)
		if ratio < 0.98 {
			t.Errorf("gpus %d: hierarchical/exhaustive = %.4f < 0.98", c.gpus, ratio)
		}
	}
}

// BenchmarkSearchPlans is the speed check: the default search for
// Qwen3-30B-A3B on 512 B200s at seq 4096 with the real evaluator. It
// reports the points simulated per search.
func BenchmarkSearchPlans(b *testing.B) {
	cfg, dev := qwenOnB200(b)
	cl, err := hw.LoadCluster(hw.ClusterForGPU(dev.Name))
	if err != nil {
		b.Fatal(err)
	}
	var sims int
	for b.Loop() {
		ev := &SimEvaluator{Model: cfg, Device: dev, Cluster: cl, Seq: 4096} // fresh cache each search
		rep, err := Search(Request{GPUs: 512, GPUsPerNode: cl.GPUsPerNode, Experts: cfg.Experts, MemoryTarget: 0.92}, ev)
		if err != nil {
			b.Fatal(err)
		}
		sims = rep.Simulated
	}
	b.ReportMetric(float64(sims), "simulated/op")
}

// TestMemoryKeyExact: the shared estimate of a layout equals its own
// memory.Estimate, for replica counts and host sizes that share a key.
func TestMemoryKeyExact(t *testing.T) {
	cfg, dev := qwenOnB200(t)
	e := &SimEvaluator{Model: cfg, Device: dev, Seq: 4096}
	for _, c := range []struct {
		rep, shard, ep, ga int
		lastOnly           bool
	}{{1, 8, 8, 1, false}, {4, 8, 8, 1, false}, {16, 8, 4, 2, false}, {4, 8, 8, 2, true}, {1, 8, 8, 2, true}} {
		l := job.Layout{GPUs: c.rep * c.shard, DPShard: c.shard, DPReplicate: c.rep, EP: c.ep, Sharding: job.ShardFSDP,
			ReshardAfterForward: true, AllreduceLastOnly: c.lastOnly, GPUsPerNode: 8}
		p := Point{Layout: l, AC: moe.AC{Mode: moe.ACSelective}, LBS: 2, GradAccum: c.ga}
		got, err := e.MemoryFraction(p)
		if err != nil {
			t.Fatal(err)
		}
		r, err := memory.Estimate(cfg, l, memory.Batch{LBS: 2, Seq: 4096, GradAccum: c.ga}, memory.Options{AC: p.AC})
		if err != nil {
			t.Fatal(err)
		}
		if want := float64(r.Peak.Reserved) / float64(dev.MemoryBytes); got != want {
			t.Errorf("%+v: shared estimate %.6f, own %.6f", c, got, want)
		}
	}
}
