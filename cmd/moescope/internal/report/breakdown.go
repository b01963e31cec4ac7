package report

import (
	"sort"

	"github.com/moescope/moescope/parallel/sim"
)

// StepPart is one part of a step's critical path, for tables and plots.
type StepPart struct {
	Name    string
	Seconds float64
}

// StepParts lists b's critical-path parts in the order every command
// prints them: compute, recompute, optimizer, then exposed communication by
// collective kind, sorted. They sum to the step time (sim's breakdown
// charges every instant of the slowest rank's compute stream once).
func StepParts(b sim.Breakdown) []StepPart {
	out := []StepPart{{"compute", b.ComputeS}, {"recompute", b.RecomputeS}, {"optimizer", b.OptimizerS}}
	kinds := make([]string, 0, len(b.ExposedCommS))
	for k := range b.ExposedCommS {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		out = append(out, StepPart{"exposed " + k, b.ExposedCommS[k]})
	}
	return out
}
