package sim

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe/job"
)

// TestCUDAGraphs: full graphs on one expert-parallel rank (ep 1, the
// only layout torchtitan main captures with its all-to-all) price every
// forward and backward op without the host launch floor, so the launch
// overhead falls to zero and what it was is named cuda_graphs_saved, the
// step shorter by at least nothing; the memory peak grows by the static
// input ids and labels, 16 bytes per token: 4 × 128 × 16 = 8,192 bytes
// (memory/graphs.go, hand-counted). Per-layer graphs of a dropless MoE
// leave the routed experts' launches (Megatron-LM captures them only
// padded to capacity) and keep the first block's static input and one
// output gradient, 2 × 512 tokens × hidden 32 × 2 bytes = 65,536 bytes.
func TestCUDAGraphs(t *testing.T) {
	run := func(g job.CUDAGraphs) Result {
		in := simTestInput(t, "tiny", 8, 1, 4, 128, 1, "none")
		in.CUDAGraphs = g
		r, err := Simulate(in)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	none, full, layers := run(job.NoGraphs), run(job.FullGraphs), run(job.LayerGraphs)
	launch := none.Breakdown.OverheadS[OverheadLaunch]
	if _, ok := none.Breakdown.OverheadS[OverheadGraphSaved]; ok || !(launch > 0) {
		t.Fatalf("no graphs: launch %g s, saved listed: %v", launch, none.Breakdown.OverheadS)
	}
	if got := full.Breakdown.OverheadS[OverheadLaunch]; got != 0 {
		t.Errorf("full graphs: launch overhead %g s, want 0", got)
	}
	if got := full.Breakdown.OverheadS[OverheadGraphSaved]; !near(got, launch, 1e-9) {
		t.Errorf("full graphs saved %g s, want the eager launch overhead %g s", got, launch)
	}
	if !(full.StepTimeS < none.StepTimeS) {
		t.Errorf("full graphs: step %g s, none %g s", full.StepTimeS, none.StepTimeS)
	}
	// Allocated exactly; reserved never less (the allocator's slack may
	// absorb the buffers).
	if got := full.PeakAllocatedBytes - none.PeakAllocatedBytes; got != 8192 || full.PeakReservedBytes < none.PeakReservedBytes {
		t.Errorf("full graphs: %d bytes more allocated, want 8192 (int64 ids and labels of 512 tokens)", got)
	}
	if got := layers.PeakAllocatedBytes - none.PeakAllocatedBytes; got != 65536 || layers.PeakReservedBytes < none.PeakReservedBytes {
		t.Errorf("layer graphs: %d bytes more allocated, want 65,536", got)
	}
	l := layers.Breakdown.OverheadS
	if !(l[OverheadLaunch] > 0 && l[OverheadGraphSaved] > 0 && near(l[OverheadLaunch]+l[OverheadGraphSaved], launch, 1e-9)) {
		t.Errorf("layer graphs: launch %g + saved %g s, want both > 0 summing to %g", l[OverheadLaunch], l[OverheadGraphSaved], launch)
	}
}

// TestKnobRefusals: the settings the simulator cannot price are refused by
// name.
func TestKnobRefusals(t *testing.T) {
	for _, c := range []struct {
		name, model, want string
		ep                int
		edit              func(*Input)
	}{
		{"full graphs with ep", "tiny", "--cuda-graphs full with ep = 4", 4, func(in *Input) { in.CUDAGraphs = job.FullGraphs }},
		{"fused qkv on MLA", "deepseek-v2-lite", "--fused-qkv", 1, func(in *Input) { in.FusedQKV = true }},
	} {
		in := simTestInput(t, c.model, 8, c.ep, 1, 128, 1, "none")
		c.edit(&in)
		if _, err := Simulate(in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.want)
		}
	}
}

// TestDeepEPBuffersOutside: DeepEP's Buffer is allocated outside PyTorch's
// allocator, so a DeepEP run on ep 4 has the same peak reserved as the
// all-to-all's, and its headroom trades the all-to-all communicator's
// point-to-point buffers (the b200 registry's outside_ep_bytes,
// 3,280,000,000) for its Buffer: for the tiny
// model's hidden 32 (64 bytes in bf16) on 4 ranks (both configs queue 256
// tokens, 10 channels, 4 NVLink peers), 10·4·5·4 = 800 bytes of heads and
// 10·4·256 = 10,240 tokens of 64 + 8 + 1,024 + 512 + 512 = 2,120 bytes
// (21,708,800), 21,709,600 aligned up to 128: 21,709,696, plus the 32 MiB
// workspace: 55,264,128 bytes (csrc/config.hpp at 92fe2de, by hand), so
// 3,280,000,000 − 55,264,128 = 3,224,735,872 bytes more headroom.
func TestDeepEPBuffersOutside(t *testing.T) {
	run := func(d job.Dispatcher) Result {
		in := simTestInput(t, "tiny", 8, 4, 4, 128, 1, "none")
		in.Dispatcher = d
		r, err := Simulate(in)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a2a, deep := run(job.AllToAll), run(job.DeepEP)
	if deep.PeakReservedBytes != a2a.PeakReservedBytes {
		t.Errorf("peak reserved: deepep %d, all_to_all %d", deep.PeakReservedBytes, a2a.PeakReservedBytes)
	}
	if got := deep.Fit.HeadroomBytes - a2a.Fit.HeadroomBytes; got != 3224735872 {
		t.Errorf("headroom DeepEP gains over the all-to-all: %d bytes, want 3,224,735,872", got)
	}
}
