package plan

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/moescope/moescope/memory/verdict"
	"github.com/moescope/moescope/moe/job"
)

// Search runs the planner: hierarchical stages by default, or one
// exhaustive stage at the target scale when req.Exhaustive is set.
func Search(req Request, ev Evaluator) (*Report, error) {
	q, err := req.withDefaults()
	if err != nil {
		return nil, err
	}
	perRank := 0
	if q.GlobalBatch > 0 {
		perRank = q.GlobalBatch / q.GPUs
	}
	rep, err := q.search(ev, perRank)
	var inf *InfeasibleError
	if !q.autoCP || !errors.As(err, &inf) {
		return rep, err
	}
	// Nothing fits without context parallelism: search it, saying so.
	if q.CPs = AutoCPs(q.GPUs, q.GPUsPerNode); len(q.CPs) == 0 {
		return rep, err
	}
	cpRep, cpErr := q.search(ev, perRank)
	if cpErr != nil {
		return rep, err
	}
	cpRep.CPNote = fmt.Sprintf("no layout fits without context parallelism, so cp %v was searched as well", q.CPs[1:])
	return cpRep, nil
}

// search is one search over q's degrees.
func (q *Request) search(ev Evaluator, perRank int) (*Report, error) {
	if q.Exhaustive {
		return q.exhaustive(ev, perRank)
	}
	return q.hierarchical(ev, perRank)
}

// AutoCPs are the context-parallel degrees a search turns to when nothing
// fits without them: 1 and each power of two up to a host (cp groups of
// one host's NVLink without tp) that divides gpus.
func AutoCPs(gpus, gpusPerNode int) []int {
	out := []int{1}
	for cp := 2; cp <= gpusPerNode; cp *= 2 {
		if gpus%cp == 0 {
			out = append(out, cp)
		}
	}
	if len(out) == 1 {
		return nil
	}
	return out
}

// exhaustive evaluates every family and local batch at the target scale in
// one stage.
func (q *Request) exhaustive(ev Evaluator, perRank int) (*Report, error) {
	rep := &Report{Exhaustive: true}
	run := &stageRun{q: q, ev: ev, stage: 1, perRank: perRank, all: true}
	res, st, closest, err := run.run(q.enumerateFamilies(q.GPUs, perRank > 0))
	if err != nil {
		return nil, err
	}
	st.GPUs = q.GPUs
	rep.Simulated += st.Simulated
	if len(res) == 0 {
		return nil, q.explain(ev, q.GPUs, closest, run.refused)
	}
	st.Survivors = bestPerFamily(res)
	st.BestTPS, st.ScalingEfficiency = res[0].Score.TPS, 1
	rep.Stages = []Stage{st}
	rep.Plans, rep.Best = res, res[0]
	return rep, nil
}

// hierarchical is the seed study's method: evaluate at the smallest scale
// at which anything fits, carry the best families, grow them stage by stage
// to the target.
func (q *Request) hierarchical(ev Evaluator, perRank int) (*Report, error) {
	scales := q.probeScales(ev)
	rep := &Report{}
	var carried []Result // best per family at the previous stage
	for i, n := range scales {
		last := i == len(scales)-1
		pr := 0
		if last {
			pr = perRank
		}
		var fams []family
		ancestor := map[family]job.Layout{}
		if i == 0 {
			fams = q.enumerateFamilies(n, pr > 0)
		} else {
			fams, ancestor = q.growFamilies(carried, n, pr > 0)
		}
		sq := *q
		if !last && perRank > 0 {
			// No local batch above a data-parallel rank's share of the
			// global batch is usable at the target, so earlier stages do
			// not rank by it.
			sq.perGPUCap = perRank
		}
		// TPS grows with the local batch (larger GEMMs, communication
		// amortized over more tokens), so a family is ranked at its
		// largest fitting lbs; the exhaustive mode tries every one (and
		// the checks compare the two).
		run := &stageRun{q: &sq, ev: ev, stage: i + 1, perRank: pr, keep: 1}
		res, st, closest, err := run.run(fams)
		if err != nil {
			return nil, err
		}
		st.GPUs = n
		rep.Simulated += st.Simulated
		if len(res) == 0 {
			return nil, q.explain(ev, n, closest, run.refused)
		}
		best := bestPerFamily(res)
		st.BestTPS = res[0].Score.TPS
		if i == 0 {
			st.ScalingEfficiency = 1
			sw, nsim, err := sq.lbsSweeps(ev, best)
			if err != nil {
				return nil, err
			}
			rep.Sweeps, rep.Simulated = sw, rep.Simulated+nsim
		} else {
			st.ScalingEfficiency = st.BestTPS / rep.Stages[0].BestTPS
			if a, ok := ancestor[family{res[0].Point.Layout, res[0].Point.AC}]; ok {
				st.Grew = growth(a, res[0].Point.Layout)
			}
		}
		if last {
			st.Survivors = best
			rep.Plans, rep.Best = res, res[0]
		} else {
			if len(best) > q.Carry {
				best = best[:q.Carry]
			}
			st.Survivors = best
			carried = best
		}
		rep.Stages = append(rep.Stages, st)
	}
	return rep, nil
}

// probeScales lists the stage scales: the first is the smallest host
// multiple at which some family fits at local batch 1. A family the
// evaluator cannot estimate does not fit (memory.Estimate refuses a tp
// the model's heads or the sequence do not divide, which the caller's
// Admit refuses too): the first stage evaluates its families again and
// reports any error of one it keeps, and a scale the probe passes over
// is never evaluated, so its errors would only hide a scale that fits.
func (q *Request) probeScales(ev Evaluator) []int {
	return stageScales(q.GPUs, q.GPUsPerNode, func(n int) bool {
		// Families are probed on every worker; once one fits the rest
		// are skipped. The answer (any fits) does not depend on the
		// order they finish in.
		fams := q.enumerateFamilies(n, false)
		var found atomic.Bool
		parallelDo(len(fams), q.Workers, func(i int) error {
			if found.Load() {
				return nil
			}
			f := fams[i]
			p := Point{f.layout, f.ac, f.layout.MinLBS(), 1}
			if out, err := q.floored(ev, p); out || err != nil {
				return nil
			}
			if m, err := ev.MemoryFraction(p); err == nil && verdict.WithinTarget(m, q.MemoryTarget) {
				found.Store(true)
			}
			return nil
		})
		return found.Load()
	})
}

// lbsSweeps evaluates, for the best stage-1 family of each checkpointing
// policy, local batches from 1 to its memory limit (every one up to 8,
// else 8 evenly spread and the limit), for the TPS-and-memory-against-
// local-batch picture.
func (q *Request) lbsSweeps(ev Evaluator, best []Result) ([]Sweep, int, error) {
	var sweeps []Sweep
	sim := 0
	for _, ac := range q.ACs {
		var fam *Result
		for i := range best {
			if best[i].Point.AC == ac {
				fam = &best[i]
				break
			}
		}
		if fam == nil {
			continue
		}
		f := family{fam.Point.Layout, ac}
		max, _, err := q.sizeByMemory(ev, f, 0)
		if err != nil {
			return nil, sim, err
		}
		step := (max + 7) / 8
		var pts []Point
		for lbs := f.layout.MinLBS(); lbs <= max; lbs += step {
			if lbsValid(f.layout, lbs) {
				pts = append(pts, Point{f.layout, ac, lbs, 1})
			}
		}
		if len(pts) > 0 && pts[len(pts)-1].LBS != max {
			pts = append(pts, Point{f.layout, ac, max, 1})
		}
		res, err := evaluateAll(ev, pts, q.Workers, nil)
		if err != nil {
			return nil, sim, err
		}
		sim += len(pts)
		sweeps = append(sweeps, Sweep{AC: ac, Points: res})
	}
	return sweeps, sim, nil
}

// explain builds the infeasibility explanation at n GPUs: the closest
// point and, by memory alone, the smallest multiple of the GPU count (up to
// 64×) at which a layout would fit, or the memory target that would be
// needed. With nothing evaluated it says why: the degrees asked for that
// give no layout at n, or refused, Admit's first refusal.
func (q *Request) explain(ev Evaluator, n int, closest *Result, refused error) error {
	e := &InfeasibleError{GPUs: n, Closest: closest}
	if closest == nil {
		e.Reason = "no layout passes the filters"
		if why := q.unsearched(n); len(q.enumerateFamilies(n, false)) == 0 && len(why) > 0 {
			e.Reason += ": " + strings.Join(why, "; ")
		} else if refused != nil {
			e.Reason += ": every candidate was refused, e.g. " + strings.ReplaceAll(refused.Error(), "\n", "; ")
		}
		return e
	}
	if verdict.WithinTarget(closest.Score.MemoryFraction, q.MemoryTarget) {
		e.Reason = "no fitting layout can reach the global batch or be exported"
		if q.GlobalBatch > 0 {
			e.Needed = fmt.Sprintf("a global batch whose per-GPU share (%d sequences) a fitting local batch divides, or no export restriction", q.GlobalBatch/q.GPUs)
		}
		return e
	}
	e.Reason = fmt.Sprintf("even local batch 1 exceeds the memory target %g", q.MemoryTarget)
	for mult := 2; mult <= 64 && n*mult <= 1<<20; mult *= 2 {
		m := n * mult
		for _, f := range q.enumerateFamilies(m, false) {
			if f.layout.DPReplicate != 1 {
				continue
			}
			p := Point{f.layout, f.ac, f.layout.MinLBS(), 1}
			fr, err := ev.MemoryFraction(p)
			if err == nil && verdict.WithinTarget(fr, q.MemoryTarget) {
				e.Needed = fmt.Sprintf("at least %d GPUs (%s fits at memory fraction %.3f), or %s",
					m, p, fr, moreMemory(closest.Score.MemoryFraction, q.MemoryTarget))
				return e
			}
		}
	}
	e.Needed = fmt.Sprintf("more than %d GPUs, or %s", 64*n, moreMemory(closest.Score.MemoryFraction, q.MemoryTarget))
	return e
}

// moreMemory says what memory the closest point (at fraction frac of
// the device) would need under target: a higher target when frac ≤ 1,
// else a device with frac/target times the memory.
func moreMemory(frac, target float64) string {
	if frac <= 1 {
		return fmt.Sprintf("a memory target ≥ %.4g", frac)
	}
	return fmt.Sprintf("a device with ≥ %.2f× this one's memory", frac/target)
}
