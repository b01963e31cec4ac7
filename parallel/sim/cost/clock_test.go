package cost

import (
	"math"
	"testing"

	"github.com/moescope/moescope/moe"
)

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
	if got := one.Clock(); got != 0.8 {
		t.Errorf("one GPU: clock %v, want 0.8", got)
	}
	if got := testSpec.Clock(); got != 1 {
		t.Errorf("unset: clock %v, want 1", got)
	}
}
