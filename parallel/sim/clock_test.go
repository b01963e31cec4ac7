package sim

import (
	"math"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel/hw"
)

// E[max of n standard normals]: n = 2 and 3 in closed form (1/√π and
// 3/(2√π), from max(X, Y) = (X + Y + |X − Y|)/2 and the order-statistic
// integral), n = 5, 10, 100 from H. L. Harter's table of expected normal
// order statistics (Biometrika 48, 1961: 1.16296, 1.53875, 2.50759).
func TestExpectedMaxNormal(t *testing.T) {
	for _, c := range []struct {
		n    int
		want float64
	}{{1, 0}, {2, 1 / math.Sqrt(math.Pi)}, {3, 3 / (2 * math.Sqrt(math.Pi))}, {5, 1.16296}, {10, 1.53875}, {100, 2.50759}} {
		if got := ExpectedMaxNormal(c.n); math.Abs(got-c.want) > 1e-5 {
			t.Errorf("n = %d: %.6f, want %.6f", c.n, got, c.want)
		}
	}
	// The largest world a layout allows: finite and past the n = 100 value.
	if got := ExpectedMaxNormal(1 << 20); !(got > 4.5 && got < 5.5) {
		t.Errorf("n = 2^20: %v, want about √(2 ln n) − (ln ln n + ln 4π)/(2√(2 ln n)) ≈ 4.9", got)
	}
}

// Tensor-core kernels slow by exactly the clock share when compute-bound;
// memory-bound kernels and launch floors do not.
func TestSustainedClock(t *testing.T) {
	slow := testSpec
	slow.Sustained, slow.SpeedSD, slow.GPUs = 0.8, 0.02, 2
	share := 0.8 * (1 - 0.02/math.Sqrt(math.Pi)) // slowest of 2: 1 − sd·E[max of 2]
	if got := SlowestShare(0.02, 2); math.Abs(got-(1-0.02/math.Sqrt(math.Pi))) > 1e-12 {
		t.Errorf("SlowestShare(0.02, 2) = %v", got)
	}
	if got, want := slow.GEMMSeconds(4096, 4096, 4096), testSpec.GEMMSeconds(4096, 4096, 4096)/share; !near(got, want, 1e-12) {
		t.Errorf("4096³ GEMM at %.4f of the burst clock: %g, want %g", share, got, want)
	}
	Ms := []int64{2048, 2048, 2048, 2048}
	if got, want := slow.GroupedSeconds(Ms, 1024, 2048, moe.Forward), testSpec.GroupedSeconds(Ms, 1024, 2048, moe.Forward)/share; !near(got, want, 1e-12) {
		t.Errorf("grouped GEMM: %g, want %g", got, want)
	}
	if got, want := slow.MemorySeconds(1e9), testSpec.MemorySeconds(1e9); got != want {
		t.Errorf("memory-bound: %g, want %g (HBM does not follow the SM clock)", got, want)
	}
	if got := slow.GEMMSeconds(128, 128, 128); got != testSpec.LaunchS {
		t.Errorf("128³ GEMM: %g, want the launch floor %g", got, testSpec.LaunchS)
	}
	// One GPU waits for nobody; 0 reads as the burst clock.
	one := slow
	one.GPUs = 1
	if got := one.clock(); got != 0.8 {
		t.Errorf("one GPU: clock %v, want 0.8", got)
	}
	if got := testSpec.clock(); got != 1 {
		t.Errorf("unset: clock %v, want 1", got)
	}
}

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
		spec := ComputeSpecOf(dev)
		spec.GPUs = gpus
		lost := (r.Breakdown.ComputeByClassS["gemm"] + r.Breakdown.ComputeByClassS["grouped_gemm"] +
			r.Breakdown.ComputeByClassS["attention"]) * (1 - spec.clock())
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
