package titanlog

import (
	"fmt"
	"math"
	"sort"
)

// Steady is what a log's steady steps measure.
type Steady struct {
	// TPS is the median tokens per second per device of the kept steps.
	TPS float64
	// PeakReservedGiB is the largest max_reserved of the kept steps: each
	// logged value is the peak since the previous log (metrics.py resets
	// the peak stats after logging), so the run's peak is their maximum.
	PeakReservedGiB float64
	// MFU is the median MFU (fraction, torchtitan's count), nil when any
	// kept step prints N/A.
	MFU *float64
	// First and Last are the step numbers kept; Kept how many.
	First, Last, Kept int
}

// Steady drops the first skip logged steps (the first includes
// torch.compile's compilation and the allocator's warm-up) and summarises
// the rest. A log with no step left is an error saying why.
func (lg *Log) Steady(skip int) (Steady, error) {
	if skip < 0 {
		return Steady{}, fmt.Errorf("--skip-steps = %d: must be ≥ 0", skip)
	}
	if len(lg.Steps) == 0 {
		return Steady{}, fmt.Errorf("%s: no step lines of rank 0: torchtitan logs one every metrics.log_freq steps "+
			"(default 10); was the run stopped before its first log, or is this not a torchtitan console log?", lg.Name)
	}
	if len(lg.Steps) <= skip {
		return Steady{}, fmt.Errorf("%s: no steady steps: %d logged step(s) (steps %d–%d), all dropped by --skip-steps %d; "+
			"run more steps (or a smaller metrics.log_freq) or lower --skip-steps", lg.Name, len(lg.Steps), lg.Steps[0].Step,
			lg.Steps[len(lg.Steps)-1].Step, skip)
	}
	kept := lg.Steps[skip:]
	s := Steady{First: kept[0].Step, Last: kept[len(kept)-1].Step, Kept: len(kept)}
	tps := make([]float64, len(kept))
	var mfu []float64
	for i, st := range kept {
		tps[i] = st.TPS
		s.PeakReservedGiB = math.Max(s.PeakReservedGiB, st.MemoryGiB)
		if st.MFU != nil {
			mfu = append(mfu, *st.MFU)
		}
	}
	s.TPS = median(tps)
	if len(mfu) == len(kept) {
		m := median(mfu)
		s.MFU = &m
	}
	if !(s.TPS > 0) {
		return Steady{}, fmt.Errorf("%s: steps %d–%d: median tps = %v: must be > 0", lg.Name, s.First, s.Last, s.TPS)
	}
	return s, nil
}

// median of xs (the mean of the middle two for an even count); xs is
// reordered.
func median(xs []float64) float64 {
	sort.Float64s(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}
