package memory

import "fmt"

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
	return Fit{
		Fits:          need <= capacity,
		HeadroomBytes: capacity - need,
		WithinTarget:  capacity > 0 && WithinTarget(float64(reserved)/float64(capacity), target),
		need:          need, reserved: reserved, capacity: capacity, target: target,
	}
}

// Line is the first line of a command's text output: "does not fit: needs
// X GiB of Y GiB" when the layout would run out of memory, "above the
// memory target: X GiB > t × Y GiB" when it fits but exceeds the target,
// and "" otherwise.
func (f Fit) Line() string {
	gib := func(n int64) float64 { return float64(n) / (1 << 30) }
	switch {
	case !f.Fits:
		return fmt.Sprintf("does not fit: needs %.2f GiB of %.2f GiB", gib(f.need), gib(f.capacity))
	case !f.WithinTarget:
		return fmt.Sprintf("above the memory target: %.2f GiB > %g × %.2f GiB", gib(f.reserved), f.target, gib(f.capacity))
	}
	return ""
}
