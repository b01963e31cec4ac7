package sim

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// Breakdown splits the step time of the simulated (slowest) rank along
// its critical path, the compute stream: busy time is compute, recompute
// or optimizer; idle time is exposed communication, charged to the
// collectives in flight during the gap in proportion to how long each
// overlaps it, or to "other" when none is (all-to-alls that run inline on
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
	// OverheadS names the costs a real step pays beyond the model's ops
	// (Overheads: routing, fsdp_copy, grad_clip, loss, launch, host_sync,
	// nccl_contention), seconds each takes on whichever stream it runs;
	// they are inside the parts above, not added to them.
	OverheadS map[string]float64 `json:"overhead_s"`
}

// breakdown charges the compute stream's time: busy spans to compute,
// recompute or optimizer (all-to-alls that run inline are exposed in
// full); idle gaps to the collectives in flight during the gap, in
// proportion to how long each overlaps it (a gap with none in flight is
// charged to "other"). The parts sum to the step time.
func breakdown(s *parallel.Schedule, sim *simulated, spans []simSpan, step float64) (Breakdown, string) {
	c := newStepCharges(s, sim, spans)
	prevEnd := 0.0
	for _, i := range c.order {
		c.chargeGap(prevEnd, spans[i].start)
		c.chargeBusy(i)
		prevEnd = math.Max(prevEnd, spans[i].end)
	}
	// Collectives still running after the last compute op (ZeRO
	// re-gathers, trailing reductions).
	c.chargeGap(prevEnd, step)
	return c.b, bottleneck(c.b, c.detail)
}

// stepCharges is a breakdown being accumulated along the compute stream.
type stepCharges struct {
	s     *parallel.Schedule
	sim   *simulated
	spans []simSpan
	order []int // compute-stream ops, by start
	colls []int // collectives on the side streams, by start
	b     Breakdown
	// detail refines the exposed time by kind, axis and link class, to
	// name the bottleneck.
	detail map[string]float64
}

// newStepCharges orders the ops by start, compute stream and side streams
// apart, and totals each kind's collective time (overlapped or not).
func newStepCharges(s *parallel.Schedule, sim *simulated, spans []simSpan) *stepCharges {
	c := &stepCharges{s: s, sim: sim, spans: spans, detail: map[string]float64{},
		b: Breakdown{ExposedCommS: map[string]float64{}, CommS: map[string]float64{}, ComputeByClassS: map[string]float64{}}}
	for i, o := range sim.ops {
		if o.stream == simCompute {
			c.order = append(c.order, i)
		} else if o.coll {
			c.colls = append(c.colls, i)
		}
		if o.coll {
			c.b.CommS[string(sim.comm[i].Kind)] += spans[i].end - spans[i].start
		}
		if sim.cp != nil {
			for k, v := range sim.cp[i].total {
				if v > 0 {
					c.b.CommS[cpCollNames[k]] += v
				}
			}
		}
	}
	sort.SliceStable(c.order, func(a, b int) bool { return spans[c.order[a]].start < spans[c.order[b]].start })
	sort.SliceStable(c.colls, func(a, b int) bool { return spans[c.colls[a]].start < spans[c.colls[b]].start })
	return c
}

// label names collective i by kind, axis and link class.
func (c *stepCharges) label(i int) string {
	return fmt.Sprintf("%s (%s, %s)", c.sim.comm[i].Kind, c.s.Ops[i].Axis, c.sim.comm[i].Link)
}

// chargeGap charges the compute stream's idle time [from, to) to the
// side-stream collectives in flight, in proportion to their overlap with
// it, or to "other" when none is.
func (c *stepCharges) chargeGap(from, to float64) {
	if to <= from {
		return
	}
	// In the collectives' start order, so that the sums below are the same
	// on every run (a map's order is not).
	type overlap struct {
		op int
		s  float64
	}
	var share []overlap
	total := 0.0
	for _, i := range c.colls {
		if c.spans[i].start >= to {
			break
		}
		if ov := math.Min(to, c.spans[i].end) - math.Max(from, c.spans[i].start); ov > 0 {
			share = append(share, overlap{i, ov})
			total += ov
		}
	}
	if total == 0 {
		c.b.ExposedCommS["other"] += to - from
		c.detail["other"] += to - from
		return
	}
	for _, o := range share {
		c.b.ExposedCommS[string(c.sim.comm[o.op].Kind)] += (to - from) * o.s / total
		c.detail[c.label(o.op)] += (to - from) * o.s / total
	}
}

// chargeBusy charges compute-stream op i's span: an inline collective is
// exposed in full; a compute op splits into its recompute and the rest,
// and by op class.
func (c *stepCharges) chargeBusy(i int) {
	d := c.spans[i].end - c.spans[i].start
	switch {
	case c.sim.ops[i].coll:
		c.b.ExposedCommS[string(c.sim.comm[i].Kind)] += d
		c.detail[c.label(i)] += d
	case c.s.Ops[i].Phase == parallel.PhaseOptimizer:
		c.b.OptimizerS += d
	default:
		d -= c.chargeCP(i, d)
		c.b.RecomputeS += c.sim.recompute[i]
		c.b.ComputeS += d - c.sim.recompute[i]
		if c.sim.byClass != nil {
			for k, v := range c.sim.byClass[i] {
				c.b.ComputeByClassS[cost.OpClass(k).String()] += v
			}
		}
	}
}

// bottleneck names the largest part of b: compute (with recompute and
// optimizer) against each kind of exposed communication; a communication
// bottleneck is named with the axis and link class that expose most of it
// (detail, by label). Keys are visited sorted so that ties always resolve
// the same way.
func bottleneck(b Breakdown, detail map[string]float64) string {
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
		return name
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
	return "exposed " + best
}
