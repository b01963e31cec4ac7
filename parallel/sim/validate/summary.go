package validate

import (
	"math"
	"slices"
)

// Summary is what a table's errors come to: the median and the worst
// |relative error| (fractions: 0.05 is 5%) over Runs runs.
type Summary struct {
	Median float64 `json:"median"`
	Worst  float64 `json:"worst"`
	Runs   int     `json:"runs"`
}

// summarize the relative errors errs by their absolute values; nil when
// there are none, so that an empty table states no median.
func summarize(errs []float64) *Summary {
	if len(errs) == 0 {
		return nil
	}
	abs := make([]float64, len(errs))
	for i, e := range errs {
		abs[i] = math.Abs(e)
	}
	slices.Sort(abs)
	return &Summary{Median: median(abs), Worst: abs[len(abs)-1], Runs: len(abs)}
}

// median of sorted values (the mean of the middle two for an even count).
func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}
