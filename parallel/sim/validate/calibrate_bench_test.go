package validate

import (
	"fmt"
	"testing"

	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/sim/calib"
	"github.com/moescope/moescope/parallel/sim/published"
)

// BenchmarkCalibrate/published calibrates the published runs as
// `moescope calibrate --runs` can take them: one calibration per recipe
// (calibrate fits one recipe at a time) over its single-program runs
// (calibrate refuses pipelines and runs below their power limit). Of the
// 100 published runs that is 60, in 4 calibrations; the time per run
// (ms/run) compares with the synthetic runs of package calib's benchmark.
func BenchmarkCalibrate(b *testing.B) {
	groups, n := calibrationGroups(b)
	b.Run(fmt.Sprintf("published/runs=%d", n), func(b *testing.B) {
		for b.Loop() {
			for _, rs := range groups {
				if _, err := calib.Calibrate(rs); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(b.Elapsed().Seconds()/float64(b.N*n)*1e3, "ms/run")
	})
}

// calibrationGroups are the published runs calibrate accepts, one group
// per recipe in job.PricedPrecisions' order, and how many runs they hold.
func calibrationGroups(b *testing.B) ([][]published.Run, int) {
	runs, err := Published()
	if err != nil {
		b.Fatal(err)
	}
	byRecipe := map[job.Precision][]published.Run{}
	for _, r := range runs {
		p, err := r.PrecisionRecipe()
		if err != nil {
			b.Fatal(err)
		}
		if r.PP <= 1 && !r.PowerLimited {
			byRecipe[p] = append(byRecipe[p], r)
		}
	}
	var groups [][]published.Run
	n := 0
	for _, p := range job.PricedPrecisions {
		if rs := byRecipe[p]; len(rs) > 0 {
			groups = append(groups, rs)
			n += len(rs)
		}
	}
	return groups, n
}
