// Package verdict judges whether one rank's memory fits its device
// (DESIGN.md, "Fits"): the peak reserved bytes with the memory outside
// PyTorch's allocator against the capacity, the memory target, and the
// model's uncalibrated interval. It knows no device and no model: the
// memory package and the simulator pass it their numbers.
package verdict

import (
	"fmt"

	"github.com/moescope/moescope/internal/band"
)

// DefaultMemoryTarget is the memory target of every command (DESIGN.md,
// "Units in JSON"): the largest peak reserved ÷ device capacity a plan may
// use.
const DefaultMemoryTarget = 0.92

// Fit is the verdict on one rank's memory (DESIGN.md, "Fits"). The
// capacity, the memory outside PyTorch's allocator and the target are
// arguments: this package knows no device.
type Fit struct {
	// Fits: peak reserved plus the memory outside PyTorch's caching
	// allocator (CUDA context, communication libraries) is at most the
	// device's capacity, so the step would not run out of memory.
	Fits bool `json:"fits"`
	// HeadroomBytes is capacity − (peak reserved + outside); negative when
	// the layout does not fit.
	HeadroomBytes int64 `json:"headroom_bytes"`
	// WithinTarget: peak reserved ≤ target × capacity.
	WithinTarget bool `json:"within_target"`
	// MemoryFractionInterval is the 90% interval of peak reserved ÷
	// capacity: the model's uncalibrated memory band over the published
	// runs (band.Uncalibrated). Verdict (DESIGN's fit_verdict) judges the
	// interval: Fits when its high end fits with the memory outside
	// PyTorch, DoesNotFit when its low end does not, MayNotFit
	// when it straddles the capacity.
	MemoryFractionInterval [2]float64 `json:"memory_fraction_interval"`
	Verdict                string     `json:"fit_verdict"`

	need, reserved, capacity int64
	target                   float64
}

// WithinTarget reports whether a memory fraction (peak reserved ÷
// capacity) is within target: the one test the commands and the planner
// apply.
func WithinTarget(fraction, target float64) bool { return fraction <= target }

// Judge is the verdict on a peak of reserved bytes with outside bytes used
// beside PyTorch's allocator, on a device of capacity bytes (as PyTorch
// reports it), against target.
func Judge(reserved, outside, capacity int64, target float64) Fit {
	need := reserved + outside
	f := Fit{
		Fits:          need <= capacity,
		HeadroomBytes: capacity - need,
		WithinTarget:  capacity > 0 && WithinTarget(float64(reserved)/float64(capacity), target),
		need:          need, reserved: reserved, capacity: capacity, target: target,
	}
	b := band.Uncalibrated().Memory
	lo, hi := b.Low*float64(reserved), b.High*float64(reserved)
	if capacity > 0 {
		f.MemoryFractionInterval = [2]float64{lo / float64(capacity), hi / float64(capacity)}
	}
	switch c := float64(capacity); {
	case hi+float64(outside) <= c:
		f.Verdict = Fits
	case lo+float64(outside) > c:
		f.Verdict = DoesNotFit
	default:
		f.Verdict = MayNotFit
	}
	return f
}

// The verdicts (DESIGN's fit_verdict).
const (
	Fits       = "fits"
	MayNotFit  = "may not fit"
	DoesNotFit = "does not fit"
)

// Line is the first line of a command's text output: "does not fit: needs
// X GiB of Y GiB" when the layout would run out of memory, "above the
// memory target: X GiB > t × Y GiB" when it fits but exceeds the target,
// "may not fit: …" when it fits within the target but its interval
// straddles the capacity, and "" otherwise.
func (f Fit) Line() string {
	gib := func(n int64) float64 { return float64(n) / (1 << 30) }
	switch {
	case !f.Fits:
		return fmt.Sprintf("does not fit: needs %.2f GiB of %.2f GiB", gib(f.need), gib(f.capacity))
	case !f.WithinTarget:
		return fmt.Sprintf("above the memory target: %.2f GiB > %g × %.2f GiB", gib(f.reserved), f.target, gib(f.capacity))
	case f.Verdict == MayNotFit:
		return fmt.Sprintf("may not fit: needs %.2f GiB of %.2f GiB, and the memory model's 90%% interval of peak reserved (%.1f%%–%.1f%% of the device) reaches past it",
			gib(f.need), gib(f.capacity), 100*f.MemoryFractionInterval[0], 100*f.MemoryFractionInterval[1])
	}
	return ""
}
