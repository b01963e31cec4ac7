package plan

import (
	"errors"
	"fmt"
	"runtime"
	"slices"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// family is a point without its local batch and accumulation: the unit
// the stages carry forward.
type family struct {
	layout job.Layout
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
	if err := CheckHosts(q.GPUs, q.GPUsPerNode); err != nil {
		return q, err
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
		q.ACs = DefaultACs()
	}
	if len(q.Shardings) == 0 {
		q.Shardings = []job.Sharding{job.ShardFSDP, job.ShardZeRO2, job.ShardZeRO1, job.ShardDDP}
	}
	for _, tp := range q.TPs {
		if tp < 1 || tp > job.MaxDegree {
			return q, moe.FieldError{Field: "tp", Value: tp, Allowed: fmt.Sprintf("each must be in [1, %d]", job.MaxDegree)}
		}
	}
	if len(q.TPs) == 0 {
		q.TPs = []int{1}
	}
	for _, cp := range q.CPs {
		if cp < 1 || cp > job.MaxDegree {
			return q, moe.FieldError{Field: "cp", Value: cp, Allowed: fmt.Sprintf("each must be in [1, %d]", job.MaxDegree)}
		}
	}
	if len(q.CPs) == 0 {
		q.CPs, q.autoCP = []int{1}, true
	}
	for _, pp := range q.PPs {
		if pp < 1 || pp > job.MaxDegree {
			return q, moe.FieldError{Field: "pp", Value: pp, Allowed: fmt.Sprintf("each must be in [1, %d]", job.MaxDegree)}
		}
		if pp > 1 && q.Layers < 1 {
			return q, moe.FieldError{Field: "layers", Value: q.Layers, Allowed: "must be ≥ 1 to search pp > 1 (the stages split the layers)"}
		}
	}
	if len(q.PPs) == 0 {
		q.PPs = []int{1}
	}
	for _, mbs := range q.PPMicrobatchSizes {
		if mbs < 1 || mbs > q.MaxLBS {
			return q, moe.FieldError{Field: "pp_microbatch_size", Value: mbs, Allowed: fmt.Sprintf("each must be in [1, max_lbs = %d] sequences", q.MaxLBS)}
		}
	}
	if len(q.PPMicrobatchSizes) == 0 {
		q.PPMicrobatchSizes = []int{1, 2}
	}
	for _, s := range q.PPSchedules {
		if err := s.Check(); err != nil {
			return q, err
		}
	}
	if len(q.PPSchedules) == 0 {
		q.PPSchedules = []job.PPSchedule{job.PP1F1B, job.PPInterleaved1F1B}
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

// DefaultACs are the checkpointing policies searched when a Request names
// none: none, selective and full (a new slice each call, so a caller may
// keep or change it).
func DefaultACs() []moe.AC {
	return []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}}
}

// ParseACs reads plan's --ac: one policy (moe.ParseAC), or memory_budget
// alone, which searches torchtitan's memory budget at 0.25, 0.5 and 0.75.
func ParseACs(s string) ([]moe.AC, error) {
	if s == string(moe.ACMemoryBudget) {
		return []moe.AC{{Mode: moe.ACMemoryBudget, Budget: 0.25}, {Mode: moe.ACMemoryBudget, Budget: 0.5},
			{Mode: moe.ACMemoryBudget, Budget: 0.75}}, nil
	}
	ac, err := moe.ParseAC(s)
	if err != nil {
		return nil, err
	}
	return []moe.AC{ac}, nil
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
func (q *Request) shardVariants(base job.Layout, accum bool) []job.Layout {
	var out []job.Layout
	if base.Stages() > 1 {
		// Under pp torchtitan shards each stage with FSDP and does not
		// reshard after forward (apply_fsdp's default under pp); the
		// stage's weights stay gathered until its last backward (so
		// keep-gathered changes nothing), and the pipeline reduces once per
		// micro-step (allreduce- and grad-sync-last-only are not modelled
		// with it). The other modes are left out of pipeline families: each
		// would multiply the pipeline's costliest estimates by four.
		if !slices.Contains(q.Shardings, job.ShardFSDP) {
			return nil
		}
		base.Sharding, base.ReshardAfterForward = job.ShardFSDP, false
		return []job.Layout{base}
	}
	if base.DPShard == 1 {
		base.Sharding, base.ReshardAfterForward = job.ShardFSDP, true
		out = append(out, base)
	} else {
		for _, s := range q.Shardings {
			l := base
			l.Sharding, l.ReshardAfterForward = s, true
			out = append(out, l)
			if s == job.ShardFSDP {
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
	if accum && q.GradSyncLastOnly {
		for _, l := range out {
			// It skips the replica all-reduces of allreduce-last-only too.
			if l.Sharding == job.ShardFSDP && !l.AllreduceLastOnly {
				l.GradSyncLastOnly = true
				out = append(out, l)
			}
		}
	}
	return out
}

// redundant reports a layout that is another one under a second name:
// DDP without expert parallelism shards nothing along dp_shard, so every
// split of the GPUs is the layout with dp_shard 1 and dp_replicate = gpus,
// which the search enumerates as such.
func redundant(l job.Layout) bool {
	return l.Sharding == job.ShardDDP && l.EP == 1 && l.DPShard > 1
}

// CheckHosts says whether gpus GPUs can run on hosts of gpusPerNode: a job
// lies inside one host (gpus ≤ gpusPerNode, any count) or fills whole
// hosts (gpus a multiple of gpusPerNode), the rule parallel.NewMesh places
// ranks by (rank r on host r / gpus_per_node). The search's stages are
// then host multiples too (stageScales). The error names the factors and
// the nearest counts that fit.
func CheckHosts(gpus, gpusPerNode int) error {
	if gpus < 1 || gpusPerNode < 1 || gpus <= gpusPerNode || gpus%gpusPerNode == 0 {
		return nil
	}
	hosts, rest := gpus/gpusPerNode, gpus%gpusPerNode
	return fmt.Errorf("gpus = %d on hosts of gpus_per_node = %d: a job lies inside one host (at most %d GPUs) or fills whole hosts "+
		"(a multiple of %d), and %d = %d × %d + %d would leave a host part-used; the nearest that fit are %d and %d GPUs",
		gpus, gpusPerNode, gpusPerNode, gpusPerNode, gpus, hosts, gpusPerNode, rest, hosts*gpusPerNode, (hosts+1)*gpusPerNode)
}

// enumerateFamilies enumerates every family at n GPUs.
func (q *Request) enumerateFamilies(n int, accum bool) []family {
	var fams []family
	for _, pp := range q.PPs {
		for _, tp := range q.TPs {
			for _, cp := range q.CPs {
				fams = append(fams, q.meshFamilies(n, pp, tp, cp, accum)...)
			}
		}
	}
	return fams
}

// meshFamilies enumerates the families at n GPUs of pipeline degree pp,
// tensor degree tp and context degree cp.
func (q *Request) meshFamilies(n, pp, tp, cp int, accum bool) []family {
	var fams []family
	if q.skipped(n, pp, tp, cp) != "" {
		return nil
	}
	// No CP is the layout's zero value, as Resolve writes it; cp > 1
	// takes torchtitan's defaults (allgather, headtail).
	cpField, cpMethod, cpBalancer := 0, job.CPMethod(""), job.CPLoadBalancer("")
	if cp > 1 {
		cpField, cpMethod, cpBalancer = cp, job.CPAllGather, job.CPHeadTail
	}
	dp := n / tp / pp / cp
	for _, r := range divisorsOf(dp) {
		s := dp / r
		// ep borrows from dp_shard × cp × tp (torchtitan v0.2.2's
		// sparse mesh); without cp and tp, from dp_shard.
		for _, ep := range divisorsOf(s * cp * tp) {
			if ep > 1 && (q.Experts == 0 || q.Experts%ep != 0) {
				continue
			}
			for _, l := range tpVariants(job.Layout{GPUs: n, DPShard: s, DPReplicate: r, EP: ep, GPUsPerNode: q.GPUsPerNode, PP: pp,
				CP: cpField, CPMethod: cpMethod, CPLoadBalancer: cpBalancer}, tp) {
				for _, l := range q.pipeVariants(l) {
					for _, l := range q.shardVariants(l, accum) {
						if redundant(l) {
							continue
						}
						for _, ac := range q.ACs {
							fams = append(fams, family{l, ac})
						}
					}
				}
			}
		}
	}
	return fams
}

// unsearched says, for each pair of pp and tp degrees asked for that
// gives no layout at n GPUs, why (skipped), so that an empty search names
// the degree and the bound it broke.
func (q *Request) unsearched(n int) []string {
	var why []string
	for _, pp := range q.PPs {
		for _, tp := range q.TPs {
			for _, cp := range q.CPs {
				if w := q.skipped(n, pp, tp, cp); w != "" && !slices.Contains(why, w) {
					why = append(why, w)
				}
			}
		}
	}
	return why
}

// skipped returns why the search enumerates no layout of pipeline degree
// pp and tensor degree tp at n GPUs, or "" when it enumerates some.
func (q *Request) skipped(n, pp, tp, cp int) string {
	switch {
	case n%(tp*pp*cp) != 0 && cp > 1:
		return fmt.Sprintf("pp × cp × tp = %d × %d × %d does not divide gpus = %d", pp, cp, tp, n)
	case n%(tp*pp) != 0:
		return fmt.Sprintf("pp × tp = %d × %d does not divide gpus = %d", pp, tp, n)
	case pp > 1 && CheckHosts(n/pp, q.GPUsPerNode) != nil:
		// Each stage is a mesh placed on hosts as a job is (BuildPipeline).
		return fmt.Sprintf("pp = %d: a stage's gpus / pp = %d / %d = %d neither lies inside one host nor fills whole hosts "+
			"(gpus_per_node = %d)", pp, n, pp, n/pp, q.GPUsPerNode)
	case tp > q.GPUsPerNode:
		// tp lies inside a host; under pp inside each stage (the stage is
		// a dp × tp mesh, job.Layout.StageLayout), so the same bound holds
		// with and without a pipeline.
		return fmt.Sprintf("tp = %d exceeds a host (gpus_per_node = %d): tensor parallelism is searched inside one", tp, q.GPUsPerNode)
	case pp > 1 && len(q.pipeVariants(job.Layout{PP: pp})) == 0:
		return fmt.Sprintf("pp = %d: %d layers + 2 (the embedding and the output) do not split evenly into pp × virtual stages "+
			"of at least 2 layers for any schedule of %v", pp, q.Layers, q.PPSchedules)
	case pp > 1 && len(q.shardVariants(job.Layout{PP: pp}, false)) == 0:
		return fmt.Sprintf("pp = %d is searched with sharding fsdp only, which the modes %v leave out", pp, q.Shardings)
	}
	return ""
}

// pipeVariants returns base with each pipeline schedule and micro-batch
// size the search tries for its pp (base itself when pp ≤ 1): each of
// PPSchedules, single-stage ones with one stage per rank and multi-stage
// ones with two, each where the split is even (evenSplit).
func (q *Request) pipeVariants(base job.Layout) []job.Layout {
	if base.Stages() == 1 {
		base.PP = 0 // no pipeline: the layout's zero value, as everywhere else
		return []job.Layout{base}
	}
	var out []job.Layout
	for _, sched := range q.PPSchedules {
		v := 1
		if sched.MultiStage() {
			v = 2
		}
		if !evenSplit(q.Layers, base.PP*v) {
			continue
		}
		for _, mbs := range q.PPMicrobatchSizes {
			l := base
			l.PPSchedule, l.PPVirtualStages, l.PPMicrobatchSize = sched, v, mbs
			out = append(out, l)
		}
	}
	return out
}

// evenSplit reports whether torchtitan's default split gives each of the
// stages the same number of effective layers, at least two: layers + 2
// (the embedding and the output counted as one layer each) divides into
// stages equal parts (job.Layout.StageSplit then gives the first and
// last stage one transformer layer less).
func evenSplit(layers, stages int) bool {
	eff := layers + 2
	return eff%stages == 0 && eff/stages >= 2
}

// lbsValid reports whether lbs is a local batch the layout runs: any under
// no pipeline; under pp a whole number of micro-batches within the
// schedule's rules (job.Layout.Microbatches, which memory and the
// simulator apply).
func lbsValid(l job.Layout, lbs int) bool {
	if l.Stages() == 1 {
		return lbs >= 1
	}
	_, err := l.Microbatches(lbs)
	return err == nil
}

// lbsTop is the largest local batch searched for l: MaxLBS, and at a
// stage before the target no more than a data-parallel rank's share of
// the target's global batch (perGPUCap × dpShare).
func (q *Request) lbsTop(l job.Layout) int {
	if q.perGPUCap > 0 {
		return min(q.MaxLBS, q.perGPUCap*dpShare(l))
	}
	return q.MaxLBS
}

// lbsRange lists the valid local batches of l up to lbsTop, increasing.
func (q *Request) lbsRange(l job.Layout) []int {
	var out []int
	for lbs := 1; lbs <= q.lbsTop(l); lbs++ {
		if lbsValid(l, lbs) {
			out = append(out, lbs)
		}
	}
	return out
}

// tpVariants returns base with tensor parallelism tp and each etp whose
// expert mesh is whole (ep·etp divides dp_shard·tp): etp 1, and etp = tp
// when ep > 1. Without tp, base alone (tp and etp left 0, read as 1).
func tpVariants(base job.Layout, tp int) []job.Layout {
	if tp == 1 {
		return []job.Layout{base}
	}
	var out []job.Layout
	for _, etp := range []int{1, tp} {
		if etp == tp && base.EP == 1 {
			continue // etp has no effect without EP
		}
		l := base
		l.TP, l.ETP = tp, etp
		if expertMeshWhole(l) {
			out = append(out, l)
		}
	}
	return out
}

// expertMeshWhole reports whether ep·etp divides dp_shard·tp, so that
// efsdp = dp_shard·tp/(ep·etp) is whole (job.Layout.Validate's rule).
func expertMeshWhole(l job.Layout) bool {
	return (l.DPShard*l.CPDegree()*l.TPDegree())%(l.EP*l.ExpertTP()) == 0
}

// growth names how layout b grew from a.
func growth(a, b job.Layout) string {
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
func (q *Request) growFamilies(carried []Result, n int, accum bool) ([]family, map[family]job.Layout) {
	seen := map[family]bool{}
	ancestor := map[family]job.Layout{}
	var out []family
	for _, c := range carried {
		old := c.Point.Layout
		f := n / old.GPUs
		for _, b := range divisorsOf(f) {
			a := f / b
			s, r := old.DPShard*b, old.DPReplicate*a
			for _, ep := range []int{old.EP, old.EP * b} {
				if ep > 1 && (q.Experts == 0 || q.Experts%ep != 0) {
					continue
				}
				base := old
				base.GPUs, base.DPShard, base.DPReplicate, base.EP = n, s, r, ep
				if !expertMeshWhole(base) {
					continue
				}
				base.KeepGathered, base.AllreduceLastOnly, base.GradSyncLastOnly = false, false, false
				// The carried sharding mode with every FSDP option (an
				// option that did not fit on fewer GPUs may fit now); a
				// layout that had nothing to shard gains every mode. A
				// pipeline keeps its degree, schedule and micro-batches.
				var vars []job.Layout
				if base.Stages() > 1 && CheckHosts(base.StageGPUs(), q.GPUsPerNode) != nil {
					continue // a stage the hosts cannot hold (skipped)
				}
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
