package plan

import (
	"math"
	"testing"

	"github.com/moescope/moescope/parallel/sim/cost"
)

// TestSweepAndCalibrateShareNoise: a sweep's posterior spread (its own
// information matrix) and its identified flags (calibrate's rule,
// calib.IdentifiedParams) both read the one run-to-run noise, 2%. Three
// hand-made runs each move one parameter, so F is diagonal:
// F_jj = 1 + s²/σ² and std = 1/√(1 + s²/σ²).
//
//	gemm_scale          s = 1     std = 1/√2501   = 0.019996
//	attention_scale     s = 0.25  std = 1/√157.25 = 0.079745
//	memory_bound_scale  s = 0.2   std = 1/√101    = 0.099504
//	the other four      s = 0     std = 1
//
// Calibrate identifies a parameter whose column norm is at least
// √50·σ/ln 2 = 7.0711 × 0.02 / 0.69315 = 0.20403 (50× the prior's
// information, the prior's σ ln 2): gemm (1) and attention (0.25) pass,
// memory-bound (0.2) falls just short. At the old sweep noise (0.1%) the
// spreads would be 20× smaller; at calibrate's old 3% the threshold,
// 0.306, would refuse attention too.
func TestSweepAndCalibrateShareNoise(t *testing.T) {
	if cost.RunTPSNoise != 0.02 {
		t.Fatalf("cost.RunTPSNoise = %v: the hand derivation below assumes 2%%", cost.RunTPSNoise)
	}
	job := func(name string, s float64) SweepJob {
		return SweepJob{Sensitivity: map[string]float64{name: s}}
	}
	jobs := []SweepJob{job(cost.CalGEMM, 1), job(cost.CalAttention, 0.25), job(cost.CalMemoryBound, 0.2)}
	want := map[string]struct {
		std        float64
		identified bool
	}{
		cost.CalGEMM:        {0.019996, true},
		cost.CalAttention:   {0.079745, true},
		cost.CalMemoryBound: {0.099504, false},
		cost.CalGrouped:     {1, false},
		cost.CalNVLink:      {1, false},
		cost.CalNet:         {1, false},
		cost.CalNodeSpread:  {1, false},
	}
	for _, p := range paramStatus(jobs) {
		w := want[p.Name]
		if math.Abs(p.Std/w.std-1) > 1e-4 {
			t.Errorf("%s: posterior std %.6f, want %.6f (σ = 2%%)", p.Name, p.Std, w.std)
		}
		if p.Identified != w.identified {
			t.Errorf("%s: identified %v, want %v (threshold 0.20403 at σ = 2%%)", p.Name, p.Identified, w.identified)
		}
	}
}
