package memory

import (
	"fmt"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// megatronDDP is megatronRecipe with Megatron-Core's gradient buffer.
func megatronDDP(t *testing.T) Options {
	t.Helper()
	r := megatronRecipe(t)
	r.DDPImpl = job.MegatronDDP
	return OptionsOf(r, moe.AC{Mode: moe.ACNone})
}

// TestContiguousGrads: under Megatron-Core's DistributedDataParallel the
// step's only gradient event is the buffer, the whole local gradient in
// fp32, 4Ψ bytes (Ψ = denseParams by hand), allocated in setup after the
// parameters and before the optimizer state and never freed; no gradient
// is allocated in backward and no reduce-scatter buffer; so it is live at
// the peak whole, with nothing else of its kind — for one micro-step and
// for four, and on each rank of a pipeline (whose stage holds its own
// parameters' buffer).
func TestContiguousGrads(t *testing.T) {
	cfg := denseCfg()
	o := megatronDDP(t)
	check := func(name string, r Report) {
		t.Helper()
		var n int
		for i, e := range r.Events {
			switch {
			case e.Category == CatGrads:
				n++
				if !e.Alloc || e.Label != "grad_buffer" || e.Bytes != r.State.Grads || e.Phase != Setup {
					t.Errorf("%s: gradient event %v", name, e)
				}
				if i == 0 || r.Events[i-1].Category != CatParams || r.Events[i+1].Category != CatOptimizer {
					t.Errorf("%s: the buffer is not between the parameters and the optimizer state", name)
				}
			case e.Category == CatUnshardGrad || e.Label == "reduce_scatter":
				t.Errorf("%s: %v under Megatron's buffer", name, e)
			}
		}
		if n != 1 {
			t.Errorf("%s: %d gradient events, want 1", name, n)
		}
		// the allocator rounds a request up to 512 bytes (docs/memory.md)
		if got, want := r.Peak.Live[CatGrads], (r.State.Grads+511)/512*512; got != want {
			t.Errorf("%s: gradients at peak %d, want the buffer's %d rounded up to 512 B, %d", name, got, r.State.Grads, want)
		}
	}
	for _, accum := range []int{1, 4} {
		r, err := Estimate(cfg, layout(8, 8, 1, job.ShardZeRO1), Batch{LBS: 1, Seq: 16, GradAccum: accum}, o)
		if err != nil {
			t.Fatal(err)
		}
		if r.State.Grads != 4*denseParams {
			t.Fatalf("gradients %d bytes, want 4Ψ = %d", r.State.Grads, 4*denseParams)
		}
		check("zero1", r)
	}
	l := pipelineLayout(t, job.Layout{GPUs: 2, PP: 2, Sharding: job.ShardZeRO1, PPImpl: job.PPMegatron})
	for r := range l.PP {
		rr, err := pipelineRankReport(cfg, l, Batch{LBS: 3, Seq: 16}, o, r)
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("pp rank %d", r), rr)
	}
	if _, err := Estimate(cfg, layout(8, 8, 1, job.ShardFSDP), Batch{LBS: 1, Seq: 16}, o); err == nil {
		t.Error("ddp_impl megatron accepted with sharding fsdp")
	}
}
