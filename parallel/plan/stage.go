package plan

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"

	"github.com/moescope/moescope/memory/largest"
	"github.com/moescope/moescope/memory/verdict"
	"github.com/moescope/moescope/moe/job"
)

// place is what the search knows about a family at one scale before
// simulating: its largest local batch within the memory target.
type place struct {
	fam     family
	maxLBS  int
	minFrac float64 // memory fraction at lbs 1 (for explanations)
}

// sizeByMemory finds the largest lbs ≤ q.lbsTop whose memory fraction is
// within the target; 0 when even lbs 1 does not fit. MemoryFraction is
// non-decreasing in lbs and close to affine (state + activations ∝ lbs), so
// the limit is first guessed from the slope between lbs 1 and 2 and the
// guess and its neighbour checked (four evaluations when memory is affine);
// a guess past the last local batch, or none, probes the last two batches
// and aims the line through them; any remaining bracket is closed by
// interpolation alternating with bisection. The answer needs monotonicity
// only: the probes choose how fast it is found, never what it is
// (TestPlanMaxLBS, TestPlanSimSizeByMemoryScan). perRank > 0 (sequences per rank per step) sets
// grad_accum = ⌈perRank / lbs⌉, else 1.
//
// Under pp only some local batches run (lbsValid): the search is the same
// over their increasing list, index i standing for its i-th entry, and
// "lbs 1" above for the smallest (one micro-batch).
func (q *Request) sizeByMemory(ev Evaluator, f family, perRank int) (int, float64, error) {
	perRank *= dpShare(f.layout) // sequences per data-parallel rank: its tp ranks and pipeline stages share them
	at, top := func(i int) int { return i }, q.lbsTop(f.layout)
	if f.layout.Stages() > 1 {
		// The smallest batch the schedule accepts (job.Layout.MinLBS) may exceed a
		// stage's share of the target's global batch (lbsTop) or MaxLBS:
		// then no local batch is usable, and the memory of that smallest
		// batch is what explains it.
		r := q.lbsRange(f.layout)
		if len(r) == 0 {
			m, err := ev.MemoryFraction(Point{f.layout, f.ac, f.layout.MinLBS(), 1})
			return 0, m, err
		}
		at, top = func(i int) int { return r[i-1] }, len(r)
	}
	fits := func(i int) (float64, error) {
		lbs := at(i)
		ga := 1
		if perRank > 0 {
			ga = (perRank + lbs - 1) / lbs
		}
		return ev.MemoryFraction(Point{f.layout, f.ac, lbs, ga})
	}
	i, m1, err := largest.Within(top, q.MemoryTarget, fits)
	return map[bool]int{true: at(max(i, 1)), false: 0}[i > 0], m1, err
}

// dpShare is how many GPUs share one data-parallel rank's sequences: its
// tp ranks and its pipeline stages.
func dpShare(l job.Layout) int { return l.CPDegree() * l.TPDegree() * l.Stages() }

// lbsChoices are the local batches simulated for a family whose memory
// limit is max: every power of two below max and max itself (all of 1..max
// when all is set). With a global batch, only divisors of perRank (the
// sequences each rank must consume per step) qualify, grad_accum =
// perRank / lbs; keep limits the choice to the largest ones. valid, when set, admits only
// the local batches it accepts (a pipeline's whole micro-batches).
func lbsChoices(max, perRank int, all bool, keep int, valid func(int) bool) [][2]int {
	var out [][2]int
	add := func(lbs int) {
		if valid != nil && !valid(lbs) {
			return
		}
		if perRank > 0 {
			if perRank%lbs != 0 {
				return
			}
			out = append(out, [2]int{lbs, perRank / lbs})
			return
		}
		out = append(out, [2]int{lbs, 1})
	}
	if perRank > 0 && max > perRank {
		max = perRank
	}
	for lbs := 1; lbs <= max; lbs++ {
		if all || perRank > 0 || lbs&(lbs-1) == 0 || lbs == max {
			add(lbs)
		}
	}
	if perRank > 0 && !all && len(out) > 0 {
		// With a global batch, the powers-of-two rule becomes: the
		// largest divisors, plus halvings, bounded like the free case.
		var sel [][2]int
		for i := len(out) - 1; i >= 0 && len(sel) < 1+floorLog2(max); i-- {
			sel = append(sel, out[i])
		}
		out = sel
		sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	}
	if keep > 0 && len(out) > keep {
		out = out[len(out)-keep:]
	}
	return out
}

func floorLog2(n int) int {
	k := 0
	for n > 1 {
		n >>= 1
		k++
	}
	return k
}

// stageRun evaluates families at one scale: it sizes each by memory,
// prunes those that do not fit, and simulates the chosen local batches.
type stageRun struct {
	q       *Request
	ev      Evaluator
	stage   int
	perRank int // sequences per rank per step at this scale (0 = free)
	all     bool
	keep    int
	// refused is Admit's first refusal, in family order: what an empty
	// search says when every family was refused.
	refused error
}

// run evaluates fams: it drops the families Admit refuses (admit), sizes
// the others by memory (sizeAll), enumerates the local batches of those
// that fit (choose), simulates them and keeps those within the target,
// best first. closest is the point nearest the target by memory, for the
// explanation of an empty result.
func (s *stageRun) run(fams []family) (results []Result, st Stage, closest *Result, err error) {
	q := s.q
	usable := s.admit(fams, &st)
	sizes, err := s.sizeAll(usable)
	if err != nil {
		return nil, st, nil, err
	}
	// nearer keeps in closest the first of the lowest memory fractions
	// seen, in family order, then results order.
	nearer := func(r Result) {
		if closest == nil || r.Score.MemoryFraction < closest.Score.MemoryFraction {
			closest = &r
		}
	}
	points := s.choose(usable, sizes, &st, nearer)
	results, err = evaluateAll(s.ev, points, q.Workers, func(done int) {
		if q.Progress != nil {
			q.Progress(s.stage, done, len(points))
		}
	})
	if err != nil {
		return nil, st, closest, err
	}
	st.Simulated = len(points)
	kept := results[:0]
	for _, r := range results {
		if verdict.WithinTarget(r.Score.MemoryFraction, q.MemoryTarget) && !r.Score.DoesNotFit && r.Score.TPS > 0 && !math.IsInf(r.Score.TPS, 0) {
			kept = append(kept, r)
		} else {
			nearer(r)
		}
	}
	if len(kept) == 0 && slices.ContainsFunc(sizes, func(z sized) bool { return z.floored }) {
		// Nothing fits: the explanation names the closest point, so the
		// floored families' own memory is needed after all, and closest
		// is found again in the same order as if none had been floored
		// (results is intact: nothing was kept).
		closest = nil
		if err := s.nearestUnsized(usable, sizes, results, nearer); err != nil {
			return nil, st, nil, err
		}
	}
	sortResults(kept)
	return kept, st, closest, nil
}

// first is a family's smallest point: its smallest local batch with the
// accumulation a global batch then needs. A method, as every step of run
// starts a family from it.
func (s *stageRun) first(f family) Point {
	lbs := f.layout.MinLBS()
	ga := 1
	if s.perRank > 0 {
		ga = max(1, s.perRank*dpShare(f.layout)/lbs)
	}
	return Point{f.layout, f.ac, lbs, ga}
}

// admit is run's first step: families the caller cannot use are dropped
// before anything is evaluated (Admit does not depend on the local batch),
// each counted in st as a pruned candidate, the first refusal kept in
// s.refused.
func (s *stageRun) admit(fams []family, st *Stage) []family {
	q := s.q
	var usable []family
	for _, f := range fams {
		st.GPUs = f.layout.GPUs
		if q.Admit != nil {
			if err := q.Admit(s.first(f)); err != nil {
				if s.refused == nil {
					s.refused = err
				}
				st.Candidates++
				st.Pruned++
				continue
			}
		}
		usable = append(usable, f)
	}
	return usable
}

// sized is what run's sizing step (sizeAll) finds of a family: its
// largest local batch within the target (0: none), its memory fraction at
// its smallest point, and whether its state alone exceeds the target
// (floored: neither was estimated).
type sized struct {
	maxLBS  int
	m1      float64
	floored bool
}

// sizeAll is run's second step: every family sized by memory, in
// parallel; a family whose state alone exceeds the target (floored) is not
// sized, and its memory at its smallest point is estimated only if nothing
// fits, for the explanation (nearestUnsized).
func (s *stageRun) sizeAll(usable []family) ([]sized, error) {
	q := s.q
	sizes := make([]sized, len(usable))
	err := parallelDo(len(usable), q.Workers, func(i int) error {
		var err error
		if sizes[i].floored, err = q.floored(s.ev, s.first(usable[i])); sizes[i].floored || err != nil {
			return err
		}
		sizes[i].maxLBS, sizes[i].m1, err = q.sizeByMemory(s.ev, usable[i], s.perRank)
		return err
	})
	if err != nil {
		return nil, err
	}
	return sizes, nil
}

// choose is run's third step: the points to simulate, each fitting
// family's local batches (lbsChoices) that Admit accepts, counted in st.
// A family that fits at no local batch is handed to nearer (unless
// floored) at its smallest point.
func (s *stageRun) choose(usable []family, sizes []sized, st *Stage, nearer func(Result)) []Point {
	q := s.q
	var points []Point
	for i, f := range usable {
		maxLBS, m1 := sizes[i].maxLBS, sizes[i].m1
		if maxLBS == 0 {
			st.Candidates++
			st.Pruned++
			if !sizes[i].floored {
				nearer(Result{s.first(f), Score{MemoryFraction: m1}})
			}
			continue
		}
		l := f.layout
		choices := lbsChoices(maxLBS, s.perRank*dpShare(l), s.all, s.keep, func(lbs int) bool { return lbsValid(l, lbs) })
		for _, c := range choices {
			if c[1] == 1 && (f.layout.KeepGathered || f.layout.AllreduceLastOnly || f.layout.GradSyncLastOnly) {
				continue // without accumulation these options change nothing
			}
			p := Point{f.layout, f.ac, c[0], c[1]}
			st.Candidates++
			if q.Admit != nil && q.Admit(p) != nil {
				st.Pruned++
				continue
			}
			points = append(points, p)
		}
		if len(choices) == 0 { // a global batch no fitting lbs divides
			st.Candidates++
			st.Pruned++
		}
	}
	return points
}

// nearestUnsized hands nearer, when nothing fits, every family that fits
// at no local batch at its smallest point, estimating the memory of the
// floored ones, then every result, so that closest is found in the same
// order as if none had been floored. A step of its own, as only the
// explanation of an empty result needs it.
func (s *stageRun) nearestUnsized(usable []family, sizes []sized, results []Result, nearer func(Result)) error {
	for i, f := range usable {
		if sizes[i].maxLBS > 0 {
			continue
		}
		m1 := sizes[i].m1
		if sizes[i].floored {
			var err error
			if m1, err = s.ev.MemoryFraction(s.first(f)); err != nil {
				return err
			}
		}
		nearer(Result{s.first(f), Score{MemoryFraction: m1}})
	}
	for _, r := range results {
		nearer(r)
	}
	return nil
}

// memoryFloor is implemented by evaluators that bound MemoryFraction from
// below for every local batch of a point's layout, cheaply (SimEvaluator:
// memory.SetupBytes, the state alone).
type memoryFloor interface {
	MemoryFloor(p Point) (float64, error)
}

// floored reports whether ev bounds p's memory above the target whatever
// its local batch: it could never fit, and needs no timeline.
func (q *Request) floored(ev Evaluator, p Point) (bool, error) {
	fl, ok := ev.(memoryFloor)
	if !ok {
		return false, nil
	}
	b, err := fl.MemoryFloor(p)
	return err == nil && !verdict.WithinTarget(b, q.MemoryTarget), err
}

// parallelDo runs do(0..n-1) on up to workers goroutines and returns
// the error of the lowest index that failed.
func parallelDo(n, workers int, do func(i int) error) error {
	errs := make([]error, n)
	var mu sync.Mutex
	next := 0
	var wg sync.WaitGroup
	for w := 0; w < min(workers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				errs[i] = do(i)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// evaluateAll evaluates points on workers goroutines, keeping order;
// progress gets the number done after each.
func evaluateAll(ev Evaluator, points []Point, workers int, progress func(done int)) ([]Result, error) {
	out := make([]Result, len(points))
	var mu sync.Mutex
	done := 0
	err := parallelDo(len(points), workers, func(i int) error {
		sc, err := ev.Evaluate(points[i])
		if err != nil {
			return fmt.Errorf("evaluating %s: %w", points[i], err)
		}
		out[i] = Result{points[i], sc}
		mu.Lock()
		done++
		if progress != nil {
			progress(done)
		}
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// sortResults orders results best first: higher TPS, then lower memory
// fraction, then fewer replicas, smaller ep, smaller lbs (a deterministic
// total order on distinct points).
func sortResults(rs []Result) {
	sort.SliceStable(rs, func(i, j int) bool {
		a, b := rs[i], rs[j]
		if a.Score.TPS != b.Score.TPS {
			return a.Score.TPS > b.Score.TPS
		}
		if a.Score.MemoryFraction != b.Score.MemoryFraction {
			return a.Score.MemoryFraction < b.Score.MemoryFraction
		}
		if a.Point.Layout.DPReplicate != b.Point.Layout.DPReplicate {
			return a.Point.Layout.DPReplicate < b.Point.Layout.DPReplicate
		}
		if a.Point.Layout.EP != b.Point.Layout.EP {
			return a.Point.Layout.EP < b.Point.Layout.EP
		}
		return a.Point.LBS < b.Point.LBS
	})
}

// bestPerFamily keeps the best result of each family, best first.
func bestPerFamily(rs []Result) []Result {
	seen := map[family]bool{}
	var out []Result
	for _, r := range rs {
		f := family{r.Point.Layout, r.Point.AC}
		if !seen[f] {
			seen[f] = true
			out = append(out, r)
		}
	}
	return out
}
