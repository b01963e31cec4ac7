package published

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/parallel/sim"
)

// TestSeedRunWithinTarget: the study this project reproduces ran
// Qwen3-30B-A3B on 128 B200 at selective AC, local batch 22, measuring 0.93
// of device memory (parallel/sim/validate/testdata/published/aleph-alpha-seed-…json). moescope
// must say it fits and is within a 0.93 target, so that
// `plan --memory-target 0.93` can return that local batch.
func TestSeedRunWithinTarget(t *testing.T) {
	runs, err := Load("../validate/testdata/published")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range runs {
		if !strings.HasPrefix(filepath.Base(r.File), "aleph-alpha-seed") || r.GPUs != 128 || r.LBS != 22 {
			continue
		}
		found = true
		in, err := InputForRun(r)
		if err != nil {
			t.Fatal(err)
		}
		in.MemoryTarget = 0.93
		res, err := sim.Simulate(in)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Fits || !res.WithinTarget || res.MemoryFraction > 0.93 {
			t.Errorf("seed run at 128 GPUs, lbs 22: fits %v, within 0.93 %v, memory fraction %.3f", res.Fits, res.WithinTarget, res.MemoryFraction)
		}
	}
	if !found {
		t.Fatal("the seed's 128-GPU, lbs 22 run is not in parallel/sim/validate/testdata/published")
	}
}
