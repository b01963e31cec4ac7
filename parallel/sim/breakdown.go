package sim

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/moescope/moescope/parallel"
)

// Breakdown splits the step time of the simulated (slowest) rank along
// its critical path, the compute stream: busy time is compute, recompute
// or optimizer; idle time is exposed communication, charged to the
// collective the next compute op waited for (all-to-alls that run inline on
// the compute stream are exposed in full). The parts sum to the step time.
type Breakdown struct {
	ComputeS   float64 `json:"compute_s"`
	RecomputeS float64 `json:"recompute_s"`
	OptimizerS float64 `json:"optimizer_s"`
	// ExposedCommS is keyed by collective kind (all_gather, reduce_scatter,
	// all_reduce, all_to_all).
	ExposedCommS map[string]float64 `json:"exposed_comm_s"`
	// CommS is the total time collectives ran (overlapped or not), by kind.
	CommS map[string]float64 `json:"comm_s"`
	// ComputeByClassS splits compute + recompute by op class (gemm,
	// grouped_gemm, attention, memory_bound; launch overheads included).
	ComputeByClassS map[string]float64 `json:"compute_by_class_s"`
}

// breakdown charges the compute stream's time: busy spans to compute,
// recompute or optimizer (all-to-alls that run inline are exposed in
// full); idle gaps to the collectives in flight during the gap, in
// proportion to how long each overlaps it (a gap with none in flight is
// charged to "other"). The parts sum to the step time.
func breakdown(s *parallel.Schedule, sim *simulated, spans []simSpan, step float64) (Breakdown, string) {
	b := Breakdown{ExposedCommS: map[string]float64{}, CommS: map[string]float64{}, ComputeByClassS: map[string]float64{}}
	var order, colls []int
	for i, o := range sim.ops {
		if o.stream == simCompute {
			order = append(order, i)
		} else if o.coll {
			colls = append(colls, i)
		}
		if o.coll {
			b.CommS[string(sim.comm[i].Kind)] += spans[i].end - spans[i].start
		}
	}
	sort.SliceStable(order, func(a, c int) bool { return spans[order[a]].start < spans[order[c]].start })
	sort.SliceStable(colls, func(a, c int) bool { return spans[colls[a]].start < spans[colls[c]].start })
	// detail refines the exposed time by kind, axis and link class, to
	// name the bottleneck.
	detail := map[string]float64{}
	label := func(i int) string {
		return fmt.Sprintf("%s (%s, %s)", sim.comm[i].Kind, s.Ops[i].Axis, sim.comm[i].Link)
	}
	charge := func(from, to float64) {
		if to <= from {
			return
		}
		share := map[int]float64{}
		total := 0.0
		for _, i := range colls {
			if spans[i].start >= to {
				break
			}
			if ov := math.Min(to, spans[i].end) - math.Max(from, spans[i].start); ov > 0 {
				share[i] += ov
				total += ov
			}
		}
		if total == 0 {
			b.ExposedCommS["other"] += to - from
			detail["other"] += to - from
			return
		}
		for i, v := range share {
			b.ExposedCommS[string(sim.comm[i].Kind)] += (to - from) * v / total
			detail[label(i)] += (to - from) * v / total
		}
	}
	prevEnd := 0.0
	for _, i := range order {
		o := sim.ops[i]
		charge(prevEnd, spans[i].start)
		d := spans[i].end - spans[i].start
		switch {
		case o.coll:
			b.ExposedCommS[string(sim.comm[i].Kind)] += d
			detail[label(i)] += d
		case s.Ops[i].Phase == parallel.PhaseOptimizer:
			b.OptimizerS += d
		default:
			b.RecomputeS += sim.recompute[i]
			b.ComputeS += d - sim.recompute[i]
			if sim.byClass != nil {
				for c, v := range sim.byClass[i] {
					b.ComputeByClassS[OpClass(c).String()] += v
				}
			}
		}
		prevEnd = math.Max(prevEnd, spans[i].end)
	}
	// Collectives still running after the last compute op (ZeRO
	// re-gathers, trailing reductions).
	charge(prevEnd, step)
	// Bottleneck: compute (with recompute and optimizer) against each kind
	// of exposed communication; a communication bottleneck is named with
	// the axis and link class that expose most of it.
	name, top := "compute", b.ComputeS+b.RecomputeS+b.OptimizerS
	kinds := make([]string, 0, len(b.ExposedCommS))
	for k := range b.ExposedCommS {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		if v := b.ExposedCommS[k]; v > top {
			name, top = k, v
		}
	}
	if name == "compute" {
		return b, name
	}
	best, bestV := name, -1.0
	keys := make([]string, 0, len(detail))
	for k := range detail {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if strings.HasPrefix(k, name) && detail[k] > bestV {
			best, bestV = k, detail[k]
		}
	}
	return b, "exposed " + best
}
