package plan

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sort"
	"sync"

	"github.com/moescope/moescope/moe"
)

// The planner searches layouts (dp_shard × dp_replicate × ep, sharding mode,
// FSDP options), activation-checkpointing policies and local batch sizes for
// the most tokens per second per GPU within a memory target, the way a team
// does it by hand: sweep everything at one or two nodes, keep the best
// candidates, then multiply the GPU count, growing the FSDP group or the
// replica count (whichever pays), until the target count.
//
// It is written against Evaluator, so the same search runs on the
// virtual-time backend (the real evaluator) and on analytic stand-ins in
// tests.

// Point is one point of the search space: a layout, a checkpointing
// policy, a local batch (sequences per data-parallel rank per micro-step)
// and the gradient-accumulation micro-steps per optimizer step.
type Point struct {
	Layout    moe.Layout
	AC        moe.AC
	LBS       int
	GradAccum int
}

// GlobalBatch is the sequences one optimizer step consumes:
// lbs × dp_replicate × dp_shard × grad_accum.
func (p Point) GlobalBatch() int { return p.LBS * p.Layout.DP() * p.GradAccum }

func (p Point) String() string {
	l := p.Layout
	s := fmt.Sprintf("gpus=%d dp_shard=%d dp_replicate=%d ep=%d sharding=%s", l.GPUs, l.DPShard, l.DPReplicate, l.EP, l.Sharding)
	if !l.ReshardAfterForward {
		s += " no-reshard"
	}
	if l.KeepGathered {
		s += " keep-gathered"
	}
	if l.AllreduceLastOnly {
		s += " allreduce-last-only"
	}
	return s + fmt.Sprintf(" ac=%s lbs=%d grad_accum=%d", p.AC, p.LBS, p.GradAccum)
}

// TimePart is one entry of a step-time breakdown: seconds a kind of work
// spends on the critical path of the slowest rank.
type TimePart struct {
	Kind    string  `json:"kind"`
	Seconds float64 `json:"seconds"`
}

// Score is what an evaluator predicts for a point. TPS is a rank's own
// tokens per second (torchtitan's definition); MFU is a fraction under the
// torchtitan FLOP convention; MemoryFraction = peak reserved / device memory.
type Score struct {
	TPS            float64
	MFU            float64
	MemoryFraction float64
	StepTimeS      float64
	Bottleneck     string
	Breakdown      []TimePart
}

// Evaluator predicts points for the planner. Implementations must be
// safe for concurrent use: the planner calls them from several goroutines.
type Evaluator interface {
	// MemoryFraction is the peak reserved memory of p over the device's
	// memory; it must be cheap (the planner prunes with it before
	// simulating) and non-decreasing in p.LBS.
	MemoryFraction(p Point) (float64, error)
	// Evaluate predicts step time, TPS, MFU and memory of p.
	Evaluate(p Point) (Score, error)
}

// Request describes a search.
type Request struct {
	GPUs        int // target world size
	GPUsPerNode int // GPUs per host; stage 1 runs at one or two hosts
	// Experts is the routed-expert count (0 for a dense model): ep ranges
	// over the common divisors of experts and dp_shard.
	Experts int
	// MemoryTarget bounds MemoryFraction, in (0, 1].
	MemoryTarget float64
	// GlobalBatch, in sequences, fixes lbs × gpus × grad_accum at the target
	// scale; 0 leaves it free (grad_accum = 1). Earlier stages ignore it.
	GlobalBatch int
	// MaxLBS caps the local batch (default 256).
	MaxLBS int
	// ACs are the checkpointing policies searched (default none, selective, full).
	ACs []moe.AC
	// Shardings are the modes the dp_shard axis may use (default fsdp,
	// zero2, zero1, ddp).
	Shardings []moe.Sharding
	// Carry is how many layout families each stage hands to the next (default 8).
	Carry int
	// Exhaustive searches the whole space at the target scale instead of
	// the hierarchical stages.
	Exhaustive bool
	// Admit, when set, rejects points the caller cannot use (an export
	// target that cannot express them); a non-nil error names the reason.
	Admit func(Point) error
	// Workers evaluating in parallel (default GOMAXPROCS).
	Workers int
	// Progress, when set, is called after each evaluation with the stage
	// number (1-based), points done and points to do in that stage.
	Progress func(stage, done, total int)
}

// Result is an evaluated point.
type Result struct {
	Point Point
	Score Score
}

// Stage reports one stage of the search.
type Stage struct {
	GPUs int
	// Candidates is the number of points enumerated; Pruned of them failed
	// the memory target (or Admit) before simulation; Simulated were
	// evaluated.
	Candidates, Pruned, Simulated int
	// Survivors are the best results of the stage, one per family, best
	// first; at the last stage they are the plans.
	Survivors []Result
	// BestTPS is the best per-GPU TPS of the stage; ScalingEfficiency =
	// BestTPS / stage 1's BestTPS.
	BestTPS           float64
	ScalingEfficiency float64
	// Grew says how the best plan's layout grew from its stage-1 ancestor
	// family at the previous stage (e.g. "dp_shard ×4").
	Grew string
}

// Report is the outcome of a search.
type Report struct {
	Stages []Stage
	// Plans are the evaluated points at the target scale, best first
	// (highest TPS; ties broken by lower memory fraction).
	Plans []Result
	Best  Result
	// Simulated counts evaluations over all stages (sweeps included).
	Simulated int
	// Sweeps are, at stage 1, every local batch up to the memory limit of
	// the best family of each checkpointing policy.
	Sweeps []Sweep
	// Exhaustive says the report comes from the exhaustive search.
	Exhaustive bool
}

// Sweep is one family's TPS and memory against local batch.
type Sweep struct {
	AC     moe.AC
	Points []Result
}

// InfeasibleError explains why no plan exists: what came closest and
// what would be needed.
type InfeasibleError struct {
	GPUs    int
	Reason  string
	Closest *Result // lowest memory fraction seen, when one was evaluated
	Needed  string
}

func (e *InfeasibleError) Error() string {
	gpus := "GPUs"
	if e.GPUs == 1 {
		gpus = "GPU"
	}
	s := fmt.Sprintf("no feasible plan on %d %s: %s", e.GPUs, gpus, e.Reason)
	if e.Closest != nil {
		s += fmt.Sprintf("; closest: %s at memory fraction %.4g", e.Closest.Point, e.Closest.Score.MemoryFraction)
	}
	if e.Needed != "" {
		s += "; needed: " + e.Needed
	}
	return s
}

// family is a point without its local batch and accumulation: the unit
// the stages carry forward.
type family struct {
	layout moe.Layout
	ac     moe.AC
}

func (r *Request) withDefaults() (Request, error) {
	q := *r
	var errs []error
	if q.GPUs < 1 || q.GPUs > 1<<20 {
		errs = append(errs, moe.FieldError{Field: "gpus", Value: q.GPUs, Allowed: "must be in [1, 1048576]"})
	}
	if q.GPUsPerNode < 0 || q.GPUsPerNode > 1<<20 {
		errs = append(errs, moe.FieldError{Field: "gpus_per_node", Value: q.GPUsPerNode, Allowed: "must be in [1, 1048576] (0 = 8)"})
	}
	if !(q.MemoryTarget > 0 && q.MemoryTarget <= 1) {
		errs = append(errs, moe.FieldError{Field: "memory_target", Value: q.MemoryTarget, Allowed: "must be in (0, 1]"})
	}
	if q.GlobalBatch < 0 || q.GlobalBatch > 1<<40 {
		errs = append(errs, moe.FieldError{Field: "global_batch", Value: q.GlobalBatch, Allowed: "must be in [1, 1099511627776] sequences (0 = free)"})
	}
	if q.Experts < 0 {
		errs = append(errs, moe.FieldError{Field: "experts", Value: q.Experts, Allowed: "must be ≥ 0"})
	}
	if q.MaxLBS < 0 || q.MaxLBS > 1<<16 {
		errs = append(errs, moe.FieldError{Field: "max_lbs", Value: q.MaxLBS, Allowed: "must be in [1, 65536] (0 = 256)"})
	}
	if q.Carry < 0 {
		errs = append(errs, moe.FieldError{Field: "carry", Value: q.Carry, Allowed: "must be ≥ 1 (0 = 8)"})
	}
	if len(errs) > 0 {
		return q, errors.Join(errs...)
	}
	if q.GPUsPerNode == 0 {
		q.GPUsPerNode = 8
	}
	if q.MaxLBS == 0 {
		q.MaxLBS = 256
	}
	if q.Carry == 0 {
		q.Carry = 8
	}
	if q.Workers <= 0 {
		q.Workers = runtime.GOMAXPROCS(0)
	}
	if len(q.ACs) == 0 {
		q.ACs = []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}}
	}
	if len(q.Shardings) == 0 {
		q.Shardings = []moe.Sharding{moe.ShardFSDP, moe.ShardZeRO2, moe.ShardZeRO1, moe.ShardDDP}
	}
	if q.GlobalBatch > 0 {
		if q.GlobalBatch < q.GPUs || q.GlobalBatch%q.GPUs != 0 {
			return q, &InfeasibleError{GPUs: q.GPUs,
				Reason: fmt.Sprintf("global batch %d sequences is not a multiple of the data-parallel degree %d (every layout here has dp = gpus)", q.GlobalBatch, q.GPUs),
				Needed: fmt.Sprintf("a global batch that is a positive multiple of %d, e.g. %d", q.GPUs, roundUp(q.GlobalBatch, q.GPUs))}
		}
	}
	return q, nil
}

// roundUp rounds x up to a positive multiple of m.
func roundUp(x, m int) int {
	if x <= 0 {
		return m
	}
	return (x + m - 1) / m * m
}

// divisorsOf lists the divisors of n in increasing order.
func divisorsOf(n int) []int {
	var small, large []int
	for d := 1; d*d <= n; d++ {
		if n%d == 0 {
			small = append(small, d)
			if d*d != n {
				large = append(large, n/d)
			}
		}
	}
	for i := len(large) - 1; i >= 0; i-- {
		small = append(small, large[i])
	}
	return small
}

// stageScales returns the GPU counts of the stages: the first is the
// smallest of one host, two hosts, four hosts… (a divisor of the target)
// at which feasible reports a fit; each later one multiplies the previous
// by the product of the target's remaining prime factors taken until it
// reaches at least 4 (×4 per stage for powers of two), ending at the target.
func stageScales(gpus, perNode int, feasible func(n int) bool) []int {
	first := gpus
	for n := perNode; n < gpus; n *= 2 {
		if gpus%n == 0 && feasible(n) {
			first = n
			break
		}
	}
	if gpus < perNode {
		first = gpus
	}
	scales := []int{first}
	rest := gpus / first
	var primes []int
	for p := 2; p*p <= rest; p++ {
		for rest%p == 0 {
			primes = append(primes, p)
			rest /= p
		}
	}
	if rest > 1 {
		primes = append(primes, rest)
	}
	n, f := first, 1
	for i, p := range primes {
		f *= p
		if f >= 4 || i == len(primes)-1 {
			n *= f
			scales = append(scales, n)
			f = 1
		}
	}
	return scales
}

// shardVariants are the sharding modes and FSDP options tried for a
// layout. Options only exist where they change something: reshard-after-
// forward for fsdp with dp_shard > 1; keep-gathered (fsdp) and all-reduce on
// the last micro-step only (dp_replicate > 1) only with accumulation.
func (q *Request) shardVariants(base moe.Layout, accum bool) []moe.Layout {
	var out []moe.Layout
	if base.DPShard == 1 {
		base.Sharding, base.ReshardAfterForward = moe.ShardFSDP, true
		out = append(out, base)
	} else {
		for _, s := range q.Shardings {
			l := base
			l.Sharding, l.ReshardAfterForward = s, true
			out = append(out, l)
			if s == moe.ShardFSDP {
				l.ReshardAfterForward = false
				out = append(out, l)
				if accum {
					l.ReshardAfterForward, l.KeepGathered = true, true
					out = append(out, l)
				}
			}
		}
	}
	if accum && base.DPReplicate > 1 {
		for _, l := range out {
			l.AllreduceLastOnly = true
			out = append(out, l)
		}
	}
	return out
}

// redundant reports a layout that is another one under a second name:
// DDP without expert parallelism shards nothing along dp_shard, so every
// split of the GPUs is the layout with dp_shard 1 and dp_replicate = gpus,
// which the search enumerates as such.
func redundant(l moe.Layout) bool {
	return l.Sharding == moe.ShardDDP && l.EP == 1 && l.DPShard > 1
}

// enumerateFamilies enumerates every family at n GPUs.
func (q *Request) enumerateFamilies(n int, accum bool) []family {
	var fams []family
	for _, r := range divisorsOf(n) {
		s := n / r
		for _, ep := range divisorsOf(s) {
			if ep > 1 && (q.Experts == 0 || q.Experts%ep != 0) {
				continue
			}
			base := moe.Layout{GPUs: n, DPShard: s, DPReplicate: r, EP: ep, GPUsPerNode: q.GPUsPerNode}
			for _, l := range q.shardVariants(base, accum) {
				if redundant(l) {
					continue
				}
				for _, ac := range q.ACs {
					fams = append(fams, family{l, ac})
				}
			}
		}
	}
	return fams
}

// place is what the search knows about a family at one scale before
// simulating: its largest local batch within the memory target.
type place struct {
	fam     family
	maxLBS  int
	minFrac float64 // memory fraction at lbs 1 (for explanations)
}

// sizeByMemory finds the largest lbs ≤ q.MaxLBS whose memory fraction is
// within the target; 0 when even lbs 1 does not fit. MemoryFraction is
// non-decreasing in lbs and close to affine (state + activations ∝ lbs), so
// the limit is first guessed from the slope between lbs 1 and 2 and the
// guess and its neighbour checked (four evaluations when memory is affine);
// any remaining bracket is closed by doubling and bisection, which needs
// monotonicity only. perRank > 0 (sequences per rank per step) sets
// grad_accum = ⌈perRank / lbs⌉, else 1.
func (q *Request) sizeByMemory(ev Evaluator, f family, perRank int) (int, float64, error) {
	fits := func(lbs int) (bool, float64, error) {
		ga := 1
		if perRank > 0 {
			ga = (perRank + lbs - 1) / lbs
		}
		m, err := ev.MemoryFraction(Point{f.layout, f.ac, lbs, ga})
		return err == nil && m <= q.MemoryTarget, m, err
	}
	ok, m1, err := fits(1)
	if err != nil || !ok || q.MaxLBS == 1 {
		return map[bool]int{true: 1, false: 0}[ok && err == nil], m1, err
	}
	ok, m2, err := fits(2)
	if err != nil || !ok {
		return 1, m1, err
	}
	// lo fits; hi does not, or is MaxLBS+1 (nothing known above MaxLBS).
	lo, hi := 2, q.MaxLBS+1
	probe := func(lbs int) error {
		ok, _, err := fits(lbs)
		if ok {
			lo = lbs
		} else {
			hi = lbs
		}
		return err
	}
	if slope := m2 - m1; slope > 0 {
		g := 2 + int((q.MemoryTarget-m2)/slope)
		if g > lo && g < hi {
			if err := probe(g); err != nil {
				return 0, m1, err
			}
			if lo == g && g+1 < hi {
				err = probe(g + 1)
			} else if hi == g && g-1 > lo {
				err = probe(g - 1)
			}
			if err != nil {
				return 0, m1, err
			}
		}
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if hi == q.MaxLBS+1 {
			mid = min(2*lo, q.MaxLBS) // gallop: no upper bound known yet
		}
		if err := probe(mid); err != nil {
			return 0, m1, err
		}
	}
	return lo, m1, nil
}

// lbsChoices are the local batches simulated for a family whose memory
// limit is max: every power of two below max and max itself (all of 1..max
// when all is set). With a global batch, only divisors of perRank (the
// sequences each rank must consume per step) qualify, grad_accum =
// perRank / lbs; keep limits the choice to the largest ones.
func lbsChoices(max, perRank int, all bool, keep int) [][2]int {
	var out [][2]int
	add := func(lbs int) {
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
}

func (s *stageRun) run(fams []family) (results []Result, st Stage, closest *Result, err error) {
	q := s.q
	ga1 := max(1, s.perRank) // grad_accum at lbs 1
	// Families the caller cannot use are dropped before anything is
	// evaluated (Admit does not depend on the local batch).
	var usable []family
	for _, f := range fams {
		st.GPUs = f.layout.GPUs
		if q.Admit != nil && q.Admit(Point{f.layout, f.ac, 1, ga1}) != nil {
			st.Candidates++
			st.Pruned++
			continue
		}
		usable = append(usable, f)
	}
	// Size every family by memory, in parallel.
	type sized struct {
		maxLBS int
		m1     float64
	}
	sizes := make([]sized, len(usable))
	err = parallelDo(len(usable), q.Workers, func(i int) error {
		var err error
		sizes[i].maxLBS, sizes[i].m1, err = q.sizeByMemory(s.ev, usable[i], s.perRank)
		return err
	})
	if err != nil {
		return nil, st, nil, err
	}
	var points []Point
	for i, f := range usable {
		maxLBS, m1 := sizes[i].maxLBS, sizes[i].m1
		if maxLBS == 0 {
			st.Candidates++
			st.Pruned++
			if closest == nil || m1 < closest.Score.MemoryFraction {
				closest = &Result{Point{f.layout, f.ac, 1, ga1}, Score{MemoryFraction: m1}}
			}
			continue
		}
		choices := lbsChoices(maxLBS, s.perRank, s.all, s.keep)
		for _, c := range choices {
			if c[1] == 1 && (f.layout.KeepGathered || f.layout.AllreduceLastOnly) {
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
		if r.Score.MemoryFraction <= q.MemoryTarget && r.Score.TPS > 0 && !math.IsInf(r.Score.TPS, 0) {
			kept = append(kept, r)
		} else if closest == nil || r.Score.MemoryFraction < closest.Score.MemoryFraction {
			c := r
			closest = &c
		}
	}
	sortResults(kept)
	return kept, st, closest, nil
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
	rep := &Report{Exhaustive: q.Exhaustive}
	if q.Exhaustive {
		run := &stageRun{q: &q, ev: ev, stage: 1, perRank: perRank, all: true}
		res, st, closest, err := run.run(q.enumerateFamilies(q.GPUs, perRank > 0))
		if err != nil {
			return nil, err
		}
		st.GPUs = q.GPUs
		rep.Simulated += st.Simulated
		if len(res) == 0 {
			return nil, q.explain(ev, q.GPUs, closest)
		}
		st.Survivors = bestPerFamily(res)
		st.BestTPS, st.ScalingEfficiency = res[0].Score.TPS, 1
		rep.Stages = []Stage{st}
		rep.Plans, rep.Best = res, res[0]
		return rep, nil
	}

	// Stage 1 scale: the smallest host multiple at which anything fits.
	var probeErr error
	scales := stageScales(q.GPUs, q.GPUsPerNode, func(n int) bool {
		for _, f := range q.enumerateFamilies(n, false) {
			m, err := ev.MemoryFraction(Point{f.layout, f.ac, 1, 1})
			if err != nil {
				probeErr = err
				return false
			}
			if m <= q.MemoryTarget {
				return true
			}
		}
		return false
	})
	if probeErr != nil {
		return nil, probeErr
	}
	var carried []Result // best per family at the previous stage
	for i, n := range scales {
		last := i == len(scales)-1
		pr := 0
		if last {
			pr = perRank
		}
		var fams []family
		ancestor := map[family]moe.Layout{}
		if i == 0 {
			fams = q.enumerateFamilies(n, pr > 0)
		} else {
			fams, ancestor = q.growFamilies(carried, n, pr > 0)
		}
		sq := q
		if !last && perRank > 0 && perRank < sq.MaxLBS {
			// No local batch above the per-rank share of the global batch
			// is usable at the target, so earlier stages do not rank by it.
			sq.MaxLBS = perRank
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
			return nil, q.explain(ev, n, closest)
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

// growth names how layout b grew from a.
func growth(a, b moe.Layout) string {
	var parts []string
	if b.DPShard != a.DPShard {
		parts = append(parts, fmt.Sprintf("dp_shard ×%d", b.DPShard/a.DPShard))
	}
	if b.DPReplicate != a.DPReplicate {
		parts = append(parts, fmt.Sprintf("dp_replicate ×%d", b.DPReplicate/a.DPReplicate))
	}
	if b.EP != a.EP {
		parts = append(parts, fmt.Sprintf("ep ×%d", b.EP/a.EP))
	}
	if len(parts) == 0 {
		return "unchanged"
	}
	s := parts[0]
	for _, p := range parts[1:] {
		s += ", " + p
	}
	return s
}

// growFamilies multiplies carried families to n GPUs: every split of the factor
// f = n / previous into a·b grows dp_replicate by a and dp_shard by b (b = f
// is growing FSDP alone, a = f DP alone); ep stays or grows with dp_shard by
// b; the FSDP options are tried afresh. ancestor maps each new family to the carried layout it came from.
func (q *Request) growFamilies(carried []Result, n int, accum bool) ([]family, map[family]moe.Layout) {
	seen := map[family]bool{}
	ancestor := map[family]moe.Layout{}
	var out []family
	for _, c := range carried {
		old := c.Point.Layout
		f := n / old.GPUs
		for _, b := range divisorsOf(f) {
			a := f / b
			s, r := old.DPShard*b, old.DPReplicate*a
			for _, ep := range []int{old.EP, old.EP * b} {
				if s%ep != 0 || (ep > 1 && (q.Experts == 0 || q.Experts%ep != 0)) {
					continue
				}
				base := old
				base.GPUs, base.DPShard, base.DPReplicate, base.EP = n, s, r, ep
				base.KeepGathered, base.AllreduceLastOnly = false, false
				// The carried sharding mode with every FSDP option (an
				// option that did not fit on fewer GPUs may fit now); a
				// layout that had nothing to shard gains every mode.
				var vars []moe.Layout
				for _, l := range q.shardVariants(base, accum) {
					if (l.Sharding == old.Sharding || old.DPShard == 1) && !redundant(l) {
						vars = append(vars, l)
					}
				}
				for _, l := range vars {
					fam := family{l, c.Point.AC}
					if !seen[fam] {
						seen[fam] = true
						ancestor[fam] = old
						out = append(out, fam)
					}
				}
			}
		}
	}
	return out, ancestor
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
		for lbs := 1; lbs <= max; lbs += step {
			pts = append(pts, Point{f.layout, ac, lbs, 1})
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
// 64×) at which a layout would fit, or the memory target that would be needed.
func (q *Request) explain(ev Evaluator, n int, closest *Result) error {
	e := &InfeasibleError{GPUs: n, Closest: closest}
	if closest == nil {
		e.Reason = "no layout passes the filters"
		return e
	}
	if closest.Score.MemoryFraction <= q.MemoryTarget {
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
			fr, err := ev.MemoryFraction(Point{f.layout, f.ac, 1, 1})
			if err == nil && fr <= q.MemoryTarget {
				e.Needed = fmt.Sprintf("at least %d GPUs (%s fits at memory fraction %.3f), or %s",
					m, Point{f.layout, f.ac, 1, 1}, fr, moreMemory(closest.Score.MemoryFraction, q.MemoryTarget))
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
