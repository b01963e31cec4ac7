package sim

import (
	"testing"

	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// The clock overheads: on one GPU nobody waits for a slower one; on
// several both are positive and together at most what the tensor-core
// classes lose to the clock, (gemm + grouped + attention)·(1 − clock), which
// they equal for kernels that are compute-bound (launch floors and
// HBM-bound GEMMs lose less).
func TestSimulateClockOverheads(t *testing.T) {
	for _, gpus := range []int{1, 8} {
		in := simTestInput(t, "qwen3-30b-a3b", gpus, 1, 2, 1024, 1, "selective")
		r, err := Simulate(in)
		if err != nil {
			t.Fatal(err)
		}
		dev, err := hw.LookupDevice("b200") // Simulate's default GPU
		if err != nil {
			t.Fatal(err)
		}
		spec := cost.ComputeSpecOf(dev)
		spec.GPUs = gpus
		lost := (r.Breakdown.ComputeByClassS["gemm"] + r.Breakdown.ComputeByClassS["grouped_gemm"] +
			r.Breakdown.ComputeByClassS["attention"]) * (1 - spec.Clock())
		sus, slow := r.Breakdown.OverheadS[OverheadSustainedClock], r.Breakdown.OverheadS[OverheadSlowestGPU]
		if !(sus > 0) || sus+slow > lost*(1+1e-9) || sus+slow < 0.5*lost {
			t.Errorf("%d GPUs: sustained_clock %g + slowest_gpu %g, want positive and within [lost/2, lost = %g]", gpus, sus, slow, lost)
		}
		if (gpus == 1) != (slow == 0) {
			t.Errorf("%d GPUs: slowest_gpu %g", gpus, slow)
		}
	}
}

// On a part that sustains its burst rate (MI300X: sustained_ratio 1) the
// whole clock loss is the slowest GPU's.
func TestClockOverheadsNoSustainedLoss(t *testing.T) {
	in := simTestInput(t, "qwen3-30b-a3b", 8, 1, 2, 1024, 1, "selective")
	dev, err := hw.LookupDevice("mi300x")
	if err != nil {
		t.Fatal(err)
	}
	in.Device = dev
	r, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	if sus, slow := r.Breakdown.OverheadS[OverheadSustainedClock], r.Breakdown.OverheadS[OverheadSlowestGPU]; sus != 0 || !(slow > 0) {
		t.Errorf("mi300x on 8 GPUs: sustained_clock %g, slowest_gpu %g; want 0 and > 0", sus, slow)
	}
}
