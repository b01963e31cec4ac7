package validate

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/calib"
	"github.com/moescope/moescope/parallel/sim/published"
)

// TestSeedScaleOut: the scale-out issue's bar on the seed study (16 →
// 128 → 512 B200s, 28,400 → 28,000 → 26,700 tokens/s per GPU, its
// published figures): calibrated on the 16-GPU run, the 512-GPU run is
// predicted within 3% and its interval holds 26,700; calibrated on the 16-
// and 128-GPU runs, within 3%. It logs the leave-one-source-out drop,
// which the issue also asks for and which this commit does not meet (the
// spread between nodes needs three sources; without the seed two remain).
func TestSeedScaleOut(t *testing.T) {
	tb := loadTables(t)
	var seed []published.Run
	for _, r := range tb.runs {
		if strings.HasPrefix(filepath.Base(r.File), "aleph-alpha-seed") {
			seed = append(seed, r)
		}
	}
	if len(seed) != 3 || seed[0].GPUs != 16 || seed[1].GPUs != 128 || seed[2].GPUs != 512 {
		t.Fatalf("the seed's runs: %d, want its 16-, 128- and 512-GPU runs in order", len(seed))
	}
	for _, fit := range [][]published.Run{seed[:1], seed[:2]} {
		cal, err := calib.Calibrate(fit)
		if err != nil {
			t.Fatal(err)
		}
		in, err := published.InputForRun(seed[2])
		if err != nil {
			t.Fatal(err)
		}
		in.Calibration = cal
		r, err := sim.Simulate(in)
		if err != nil {
			t.Fatal(err)
		}
		e := r.TPS/seed[2].TPS - 1
		t.Logf("calibrated on %d run(s): 512 GPUs predicted %.0f (%+.1f%%), interval %.0f–%.0f; measured %.0f",
			len(fit), r.TPS, 100*e, r.TPSInterval[0], r.TPSInterval[1], seed[2].TPS)
		if e < -0.03 || e > 0.03 {
			t.Errorf("calibrated on %d run(s): 512 GPUs %+.1f%%, want within 3%%", len(fit), 100*e)
		}
		if len(fit) == 1 && (seed[2].TPS < r.TPSInterval[0] || seed[2].TPS > r.TPSInterval[1]) {
			t.Errorf("calibrated on the 16-GPU run: interval %.0f–%.0f misses the measured %.0f", r.TPSInterval[0], r.TPSInterval[1], seed[2].TPS)
		}
	}
	for _, s := range tb.scale.Series {
		if strings.HasPrefix(filepath.Base(s.File), "aleph-alpha-seed") {
			last := s.Runs[len(s.Runs)-1]
			t.Logf("seed 16 → 512 drop: measured %.1f%%, mechanisms %.1f%%, fitted %.1f%%, leave-one-source-out %.1f%%",
				100*last.MeasuredDrop, 100*last.MechanismsDrop, 100*last.FittedDrop, 100*last.LeaveOneOut)
		}
	}
}
