package cost

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// TestCuBLASExperts: TransformerEngine's per-expert cuBLAS GEMMs share the
// SMs' waves at the dense rate, so two experts of 4096 rows cost what one
// dense GEMM of 8192 rows costs (the same 2048 output tiles of 128×128 for
// N = 4096, in 16 waves of 132 SMs), with no grouped-kernel falloff in the
// rows; and each GEMM is a host launch: 64 one-row experts take at least
// 64 launches.
func TestCuBLASExperts(t *testing.T) {
	s := testSpec.WithExperts(job.CuBLASExperts)
	if s.ExpertGEMMEff != testSpec.GEMMEff {
		t.Fatalf("expert efficiency %v, want the dense %v", s.ExpertGEMMEff, testSpec.GEMMEff)
	}
	for _, pass := range []moe.Pass{moe.Forward, moe.BackwardData, moe.Recompute} {
		if got, want := s.GroupedSeconds([]int64{4096, 4096}, 4096, 4096, pass), s.GEMMSeconds(8192, 4096, 4096); !near(got, want, 1e-12) {
			t.Errorf("%v: two experts %g s, one dense GEMM %g s", pass, got, want)
		}
	}
	ones := make([]int64, 64)
	for i := range ones {
		ones[i] = 1
	}
	if got, want := s.GroupedSeconds(ones, 16, 16, moe.Forward), 64*s.LaunchS; !near(got, want, 1e-12) {
		t.Errorf("64 one-row experts: %g s, want 64 launches = %g s", got, want)
	}
	// torch._grouped_mm is one launch at the grouped rate.
	if got := testSpec.GroupedSeconds([]int64{4096, 4096}, 4096, 4096, moe.Forward); !(got > s.GroupedSeconds([]int64{4096, 4096}, 4096, 4096, moe.Forward)) {
		t.Errorf("grouped_mm %g s: want slower than cuBLAS experts at GroupedEff %v < GEMMEff %v", got, testSpec.GroupedEff, testSpec.GEMMEff)
	}
}
