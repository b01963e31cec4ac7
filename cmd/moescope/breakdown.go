package main

import (
	"sort"

	"github.com/moescope/moescope/parallel/sim"
)

// stepPart is one part of a step's critical path, for tables and plots.
type stepPart struct {
	Name    string
	Seconds float64
}

// stepParts lists b's critical-path parts in the order every command
// prints them: compute, recompute, optimizer, then exposed communication by
// collective kind, sorted. They sum to the step time (sim's breakdown
// charges every instant of the slowest rank's compute stream once).
func stepParts(b sim.Breakdown) []stepPart {
	out := []stepPart{{"compute", b.ComputeS}, {"recompute", b.RecomputeS}, {"optimizer", b.OptimizerS}}
	kinds := make([]string, 0, len(b.ExposedCommS))
	for k := range b.ExposedCommS {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		out = append(out, stepPart{"exposed " + k, b.ExposedCommS[k]})
	}
	return out
}
