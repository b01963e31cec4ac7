package sim

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
)

func tpInput(t *testing.T, model string, gpus, tp int, async bool) Input {
	t.Helper()
	cfg, err := hf.Load(model)
	if err != nil {
		t.Fatal(err)
	}
	l := job.Layout{GPUs: gpus, TP: tp, AsyncTP: async, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	dev, err := hw.LookupDevice("h100")
	if err != nil {
		t.Fatal(err)
	}
	return Input{Spec: job.Spec{Model: cfg, Layout: l, AC: moe.AC{Mode: moe.ACSelective}, Batch: job.Batch{LBS: 1, Seq: 4096}, Recipe: job.DefaultRecipe()}, Device: dev}
}

// TestTPOpsShapes: a tp rank's op records are the whole model's at its
// shapes. For Llama 3 8B (no router, V = 128256 divisible by 8) every
// matmul's and attention's count is exactly 1/tp of one rank's without tp
// (column-parallel outputs, row-parallel inputs, local heads), as are
// RoPE's and SwiGLU's on the local heads and widths, the loss's on the
// local vocabulary and the sequence-parallel norms' and residuals': the
// split is in the shapes, the per-rank counts follow. Only the embedding
// (all T rows) is not split.
func TestTPOpsShapes(t *testing.T) {
	cfg, err := hf.Load("llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	s := flops.Shape{Seq: 4096, Batch: 1}
	ac := moe.AC{Mode: moe.ACSelective}
	whole, err := flops.Ops(cfg, s, ac, flops.DefaultTile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range []int{2, 8} {
		l := job.Layout{GPUs: tp, TP: tp}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		local, err := tpOps(cfg, l, s, ac)
		if err != nil {
			t.Fatal(err)
		}
		if len(local) != len(whole) {
			t.Fatalf("tp %d: %d records, want %d", tp, len(local), len(whole))
		}
		for i, r := range local {
			w := whole[i]
			if r.Op == moe.OpEmbed {
				continue // every tp rank gathers all T rows of its vocabulary shard
			}
			if r.Count*int64(tp) != w.Count {
				t.Errorf("tp %d: %s %s layer %d: %d × %d ≠ %d", tp, r.Op, r.Pass, r.Layer, r.Count, tp, w.Count)
			}
		}
	}
}

// TestTPLink: tp collectives run on NVLink when the tp group lies in one
// NVLink domain (8 GPUs per HGX host) and on the network when it spans
// two (4 GPUs per host), and the output says which; they lengthen the
// step; async TP hides part of them.
func TestTPLink(t *testing.T) {
	in := tpInput(t, "llama3-8b", 8, 8, false)
	nv, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	if nv.TPLink != hw.LinkNVLink.String() {
		t.Errorf("tp 8 on one HGX host: tp_link %q, want nvlink", nv.TPLink)
	}
	in.Layout.GPUsPerNode = 4
	net, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	if net.TPLink != hw.LinkNet.String() {
		t.Errorf("tp 8 over hosts of 4: tp_link %q, want network", net.TPLink)
	}
	if !(net.StepTimeS > nv.StepTimeS) {
		t.Errorf("tp over the network: step %g s, not slower than over NVLink %g s", net.StepTimeS, nv.StepTimeS)
	}
	async, err := Simulate(tpInput(t, "llama3-8b", 8, 8, true))
	if err != nil {
		t.Fatal(err)
	}
	if !(async.StepTimeS < nv.StepTimeS) {
		t.Errorf("async tp: step %g s, not faster than %g s", async.StepTimeS, nv.StepTimeS)
	}
	one, err := Simulate(tpInput(t, "llama3-8b", 8, 1, false))
	if err != nil || one.TPLink != "" {
		t.Errorf("tp 1: tp_link %q, %v; want none", one.TPLink, err)
	}
	// FLOPs per token do not depend on the layout: MFU / TPS is the same.
	if a, b := one.MFU/one.TPS, nv.MFU/nv.TPS; !near(a, b, 1e-12) {
		t.Errorf("FLOPs per token differ with tp: MFU/TPS %g (tp 1) vs %g (tp 8)", a, b)
	}
	// 12 GPUs on hosts of 6 at tp 4: ranks 4–7 straddle two hosts, and
	// every rank is priced with that group (the step waits for it).
	odd := tpInput(t, "llama3-8b", 12, 4, false)
	odd.Layout.GPUsPerNode = 6
	r, err := Simulate(odd)
	if err != nil {
		t.Fatal(err)
	}
	if r.TPLink != hw.LinkNet.String() || !strings.Contains(r.Exactness, "span 2 domains") {
		t.Errorf("tp 4 on hosts of 6: tp_link %q, exactness %q", r.TPLink, r.Exactness)
	}
	eager := tpInput(t, "llama3-8b", 8, 2, true)
	eager.Compile = false
	if _, err := Simulate(eager); err == nil {
		t.Error("async tp without compile accepted; torchtitan refuses it")
	}
}

// TestTPScheduleOps: the schedule carries, per micro-step, exactly the tp
// collectives parallel.TPCollectives lists for every layer, on the tp axis
// (besides the gradient all-reduces: TestTPGradSyncPriced).
func TestTPScheduleOps(t *testing.T) {
	in := tpInput(t, "qwen3-30b-a3b", 8, 4, false)
	in.Layout.EP = 2
	in.Layout.ETP = 1
	if err := in.Layout.Resolve(); err != nil {
		t.Fatal(err)
	}
	r, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	var got, want int64
	for _, o := range r.Schedule.Ops {
		if o.Type == parallel.OpCollective && o.Axis == parallel.AxisTP && o.Purpose != parallel.PurposeTPGradSync {
			got += o.Bytes()
		}
	}
	for l := moe.LayerEmbed; l <= in.Model.LayerHead(); l++ {
		for _, c := range parallel.TPCollectives(in.Model, in.Layout, l, in.LBS*in.Seq, in.AC, moe.BF16) {
			want += c.Bytes()
		}
	}
	if got != want || got == 0 {
		t.Errorf("schedule's tp collectives move %d B, TPCollectives %d B", got, want)
	}
}

// TestTPGradSyncPriced: the all-reduce over tp of the replicated tensors'
// gradients is priced on the tp group's link. Qwen3-30B-A3B (hidden 2048,
// 48 MoE blocks, 128 experts, head_dim 128, per-head q/k norms) at tp 4:
// a block's replicated tensors are the two norms 2·2048, the q/k norms
// 2·128 and the router gate 128·2048, 266,496 elements; the head's final
// norm 2048; in bf16, 532,992 bytes per block and 4,096 for the
// head, by hand. The same ops take longer when the tp group spans hosts.
func TestTPGradSyncPriced(t *testing.T) {
	dur := func(perNode int) (float64, int) {
		in := tpInput(t, "qwen3-30b-a3b", 8, 4, false)
		in.Layout.GPUsPerNode = perNode
		in.KeepTimeline = true
		r, err := Simulate(in)
		if err != nil {
			t.Fatal(err)
		}
		var d float64
		n := 0
		for i, ot := range r.OpTimings() {
			o := r.Schedule.Ops[i]
			if o.Purpose != parallel.PurposeTPGradSync {
				continue
			}
			n++
			want := 532992.0
			if o.Layer == in.Model.LayerHead() {
				want = 4096
			}
			if ot.Bytes != want {
				t.Errorf("layer %d: tp gradient all-reduce priced at %g B, want %g", o.Layer, ot.Bytes, want)
			}
			d += ot.EndS - ot.StartS
		}
		return d, n
	}
	nv, n := dur(8)
	if n != 49 || !(nv > 0) {
		t.Fatalf("%d tp gradient all-reduces taking %g s, want 49 (48 blocks and the head) taking time", n, nv)
	}
	if net, _ := dur(2); !(net > nv) {
		t.Errorf("tp gradient all-reduces over hosts of 2: %g s, not slower than over NVLink %g s", net, nv)
	}
}
