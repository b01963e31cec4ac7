package plan

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe/job"
)

func TestPlanDivisors(t *testing.T) {
	for n, want := range map[int][]int{1: {1}, 12: {1, 2, 3, 4, 6, 12}, 16: {1, 2, 4, 8, 16}, 49: {1, 7, 49}} {
		if got := divisorsOf(n); !reflect.DeepEqual(got, want) {
			t.Errorf("planDivisors(%d) = %v, want %v", n, got, want)
		}
	}
}

func TestPlanScales(t *testing.T) {
	always := func(int) bool { return true }
	never := func(int) bool { return false }
	from32 := func(n int) bool { return n >= 32 }
	for _, c := range []struct {
		gpus, perNode int
		fits          func(int) bool
		want          []int
	}{
		// 512/8 = 2^6: primes grouped until the product reaches 4: ×4, ×4, ×4.
		{512, 8, always, []int{8, 32, 128, 512}},
		// 96/8 = 12 = 2·2·3: ×4 then the last prime ×3.
		{96, 8, always, []int{8, 32, 96}},
		// nothing fits at 8 or 16 GPUs: stage 1 at four hosts.
		{512, 8, from32, []int{32, 128, 512}},
		{512, 8, never, []int{512}},
		{4, 8, always, []int{4}},
		{16, 8, always, []int{8, 16}},
		// 12 is not a multiple of a host: one stage.
		{12, 8, always, []int{12}},
	} {
		if got := stageScales(c.gpus, c.perNode, c.fits); !reflect.DeepEqual(got, c.want) {
			t.Errorf("planScales(%d, %d) = %v, want %v", c.gpus, c.perNode, got, c.want)
		}
	}
}

func TestPlanLBSChoices(t *testing.T) {
	for _, c := range []struct {
		max, perRank int
		all          bool
		keep         int
		want         [][2]int
	}{
		// powers of two below 12, then 12 itself; no accumulation.
		{12, 0, false, 0, [][2]int{{1, 1}, {2, 1}, {4, 1}, {8, 1}, {12, 1}}},
		{12, 0, false, 2, [][2]int{{8, 1}, {12, 1}}},
		{3, 0, true, 0, [][2]int{{1, 1}, {2, 1}, {3, 1}}},
		// 16 sequences per rank per step: divisors of 16 up to 12 → 1, 2, 4, 8
		// (at most 1 + ⌊log2 12⌋ = 4 of them); grad_accum = 16 / lbs.
		{12, 16, false, 0, [][2]int{{1, 16}, {2, 8}, {4, 4}, {8, 2}}},
		{12, 16, false, 1, [][2]int{{8, 2}}},
		// 6 per rank, memory allows 100: divisors 1, 2, 3, 6.
		{100, 6, true, 0, [][2]int{{1, 6}, {2, 3}, {3, 2}, {6, 1}}},
		{0, 0, false, 0, nil},
	} {
		got := lbsChoices(c.max, c.perRank, c.all, c.keep, nil)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("planLBSChoices(%d, %d, %v, %d) = %v, want %v", c.max, c.perRank, c.all, c.keep, got, c.want)
		}
	}
}

func TestPlanShardVariants(t *testing.T) {
	q, err := (&Request{GPUs: 8, MemoryTarget: 0.9}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		shard, rep int
		accum      bool
		want       int
	}{
		// fsdp, fsdp without reshard, zero2, zero1, ddp.
		{4, 2, false, 5},
		// + fsdp keep-gathered = 6, each also with all-reduce on the last micro-step only = 12.
		{4, 2, true, 12},
		// one replica: no all-reduce option.
		{8, 1, true, 6},
		// dp_shard 1 shards nothing: one mode; with replicas and accumulation, ×2.
		{1, 8, false, 1},
		{1, 8, true, 2},
	} {
		base := job.Layout{GPUs: c.shard * c.rep, DPShard: c.shard, DPReplicate: c.rep, EP: 1}
		got := q.shardVariants(base, c.accum)
		if len(got) != c.want {
			t.Errorf("shard %d rep %d accum %v: %d variants, want %d: %v", c.shard, c.rep, c.accum, len(got), c.want, got)
		}
		seen := map[job.Layout]bool{}
		for _, l := range got {
			if seen[l] {
				t.Errorf("duplicate variant %+v", l)
			}
			seen[l] = true
			if err := l.Validate(); err != nil {
				t.Errorf("variant %+v: %v", l, err)
			}
		}
	}
}

// TestPlanShardVariantsGradSyncLastOnly: asked for, grad-sync-last-only
// adds, with accumulation only, one variant per fsdp layout that does not
// already defer the replica all-reduce (which it does too).
func TestPlanShardVariantsGradSyncLastOnly(t *testing.T) {
	q, err := (&Request{GPUs: 8, MemoryTarget: 0.9, GradSyncLastOnly: true}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		shard, rep int
		accum      bool
		want       int
	}{
		{4, 2, false, 5}, // no accumulation: nothing to defer
		// 12 as without it, + fsdp, fsdp without reshard, fsdp
		// keep-gathered with grad-sync-last-only = 15.
		{4, 2, true, 15},
		{8, 1, true, 9}, // 6 + the same 3
		{1, 8, true, 3}, // fsdp, its all-reduce-last variant, its grad-sync-last variant
	} {
		base := job.Layout{GPUs: c.shard * c.rep, DPShard: c.shard, DPReplicate: c.rep, EP: 1}
		got := q.shardVariants(base, c.accum)
		n := 0
		for _, l := range got {
			if err := l.Validate(); err != nil {
				t.Errorf("variant %+v: %v", l, err)
			}
			if l.GradSyncLastOnly {
				n++
			}
		}
		if len(got) != c.want || (c.accum && n == 0) {
			t.Errorf("shard %d rep %d accum %v: %d variants (%d grad-sync-last-only), want %d: %v", c.shard, c.rep, c.accum, len(got), n, c.want, got)
		}
	}
}

// TestPlanMaxLBS checks the doubling-and-bisection search against a linear
// scan of the same memory function.
func TestPlanMaxLBS(t *testing.T) {
	m := planStandInModel(30, 48, 2048)
	for _, target := range []float64{0.3, 0.5, 0.92, 1} {
		for _, maxLBS := range []int{1, 5, 64} {
			q, err := (&Request{GPUs: 64, Experts: 128, MemoryTarget: target, MaxLBS: maxLBS}).withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range q.enumerateFamilies(64, false) {
				got, _, err := q.sizeByMemory(m, f, 0)
				if err != nil {
					t.Fatal(err)
				}
				want := 0
				for lbs := 1; lbs <= maxLBS; lbs++ {
					fr, _ := m.MemoryFraction(Point{f.layout, f.ac, lbs, 1})
					if fr <= target {
						want = lbs
					}
				}
				if got != want {
					t.Fatalf("target %v max %d %+v %s: planMaxLBS = %d, linear scan %d", target, maxLBS, f.layout, f.ac, got, want)
				}
			}
		}
	}
}

// planCheckReport asserts the invariants every report must satisfy.
func planCheckReport(t *testing.T, req Request, rep *Report) {
	t.Helper()
	if len(rep.Plans) == 0 || !reflect.DeepEqual(rep.Best, rep.Plans[0]) {
		t.Fatalf("report has %d plans, best %+v", len(rep.Plans), rep.Best)
	}
	for i, r := range rep.Plans {
		l := r.Point.Layout
		if err := l.Validate(); err != nil {
			t.Errorf("plan %d invalid: %v", i, err)
		}
		if l.GPUs != req.GPUs {
			t.Errorf("plan %d on %d GPUs, want %d", i, l.GPUs, req.GPUs)
		}
		if l.EP > 1 && req.Experts%l.EP != 0 {
			t.Errorf("plan %d: ep %d does not divide %d experts", i, l.EP, req.Experts)
		}
		if tp := l.TPDegree(); tp > 1 && (!slices.Contains(req.TPs, tp) || tp > req.GPUsPerNode) {
			t.Errorf("plan %d: tp %d not among %v within a host of %d", i, tp, req.TPs, req.GPUsPerNode)
		}
		if r.Score.MemoryFraction > req.MemoryTarget {
			t.Errorf("plan %d over the memory target: %v", i, r.Score.MemoryFraction)
		}
		if pp := l.Stages(); pp > 1 && (!slices.Contains(req.PPs, pp) || !lbsValid(l, r.Point.LBS)) {
			t.Errorf("plan %d: pp %d not among %v, or lbs %d not whole micro-batches of %d", i, pp, req.PPs, r.Point.LBS, l.PPMicrobatchSize)
		}
		if req.GlobalBatch > 0 && r.Point.GlobalBatch() != req.GlobalBatch {
			t.Errorf("plan %d global batch %d, want %d", i, r.Point.GlobalBatch(), req.GlobalBatch)
		}
		if req.GlobalBatch == 0 && r.Point.GradAccum != 1 {
			t.Errorf("plan %d accumulates %d micro-steps without a global batch", i, r.Point.GradAccum)
		}
		if i > 0 && r.Score.TPS > rep.Plans[i-1].Score.TPS {
			t.Errorf("plans not sorted at %d", i)
		}
	}
	last := rep.Stages[len(rep.Stages)-1]
	if last.GPUs != req.GPUs {
		t.Errorf("last stage on %d GPUs", last.GPUs)
	}
	for i, st := range rep.Stages {
		if st.Simulated+st.Pruned < st.Candidates-st.Pruned || st.Simulated > st.Candidates {
			t.Errorf("stage %d counts: %+v", i, st)
		}
		if i > 0 && st.GPUs <= rep.Stages[i-1].GPUs {
			t.Errorf("stage %d does not grow: %d after %d", i, st.GPUs, rep.Stages[i-1].GPUs)
		}
	}
}

// TestHierarchicalNearExhaustive is the check on the stand-in: the
// hierarchical best is within 2% (TPS) of the exhaustive optimum for every
// model and GPU count tried, and never above it (the exhaustive space
// contains every hierarchical point).
func TestHierarchicalNearExhaustive(t *testing.T) {
	models := []struct {
		name   string
		m      *planStandIn
		counts []int
	}{
		{"30B-A3B-like", planStandInModel(30.5, 48, 2048), []int{8, 64, 512}},
		{"235B-like", planStandInModel(235, 94, 4096), []int{64, 256}},
	}
	for _, mc := range models {
		for _, n := range mc.counts {
			for _, gb := range []int{0, 4 * n} {
				req := Request{GPUs: n, GPUsPerNode: 8, Experts: 128, MemoryTarget: 0.92, GlobalBatch: gb, MaxLBS: 64}
				hier, err := Search(req, mc.m)
				if err != nil {
					t.Fatalf("%s on %d (gb %d): %v", mc.name, n, gb, err)
				}
				planCheckReport(t, req, hier)
				req.Exhaustive = true
				exh, err := Search(req, mc.m)
				if err != nil {
					t.Fatalf("%s on %d exhaustive: %v", mc.name, n, err)
				}
				planCheckReport(t, req, exh)
				ratio := hier.Best.Score.TPS / exh.Best.Score.TPS
				t.Logf("%s gpus=%d gb=%d: hierarchical %.0f TPS (%d simulated, %d stages), exhaustive %.0f TPS (%d simulated), ratio %.4f",
					mc.name, n, gb, hier.Best.Score.TPS, hier.Simulated, len(hier.Stages), exh.Best.Score.TPS, exh.Simulated, ratio)
				if ratio < 0.98 || ratio > 1+1e-12 {
					t.Errorf("%s gpus=%d gb=%d: hierarchical/exhaustive = %.4f, want in [0.98, 1]\nhier: %s\nexh:  %s",
						mc.name, n, gb, ratio, hier.Best.Point, exh.Best.Point)
				}
			}
		}
	}
}

func TestPlanStagesReport(t *testing.T) {
	m := planStandInModel(30.5, 48, 2048)
	req := Request{GPUs: 512, GPUsPerNode: 8, Experts: 128, MemoryTarget: 0.92}
	rep, err := Search(req, m)
	if err != nil {
		t.Fatal(err)
	}
	var gpus []int
	for _, st := range rep.Stages {
		gpus = append(gpus, st.GPUs)
		if st.ScalingEfficiency <= 0 || st.BestTPS <= 0 {
			t.Errorf("stage %+v has no efficiency", st)
		}
	}
	if !reflect.DeepEqual(gpus, []int{8, 32, 128, 512}) {
		t.Errorf("stages at %v, want [8 32 128 512]", gpus)
	}
	if rep.Stages[0].ScalingEfficiency != 1 {
		t.Errorf("stage 1 efficiency %v, want 1", rep.Stages[0].ScalingEfficiency)
	}
	if len(rep.Sweeps) != 3 {
		t.Errorf("%d sweeps, want one per policy (3)", len(rep.Sweeps))
	}
	for _, sw := range rep.Sweeps {
		last := sw.Points[len(sw.Points)-1].Point.LBS
		for i, p := range sw.Points {
			// up to 8 the sweep takes every local batch
			if last <= 8 && p.Point.LBS != i+1 {
				t.Errorf("sweep %s point %d has lbs %d", sw.AC, i, p.Point.LBS)
			}
		}
	}
	for i, st := range rep.Stages[:len(rep.Stages)-1] {
		if len(st.Survivors) > 8 {
			t.Errorf("stage %d carried %d families, want ≤ 8", i+1, len(st.Survivors))
		}
	}
}

func TestPlanBadInput(t *testing.T) {
	m := planStandInModel(30.5, 48, 2048)
	for _, target := range []float64{0, -0.5, 1.5} {
		_, err := Search(Request{GPUs: 8, Experts: 128, MemoryTarget: target}, m)
		if err == nil || !strings.Contains(err.Error(), "memory_target") || !strings.Contains(err.Error(), "(0, 1]") {
			t.Errorf("target %v: err = %v, want one naming memory_target and (0, 1]", target, err)
		}
	}
	_, err := Search(Request{GPUs: 0, MemoryTarget: 0.9}, m)
	if err == nil || !strings.Contains(err.Error(), "gpus") {
		t.Errorf("gpus 0: %v", err)
	}
	// A global batch of 100 sequences cannot be split over 64 data-parallel
	// ranks; the next multiple of 64 is 128.
	_, err = Search(Request{GPUs: 64, Experts: 128, MemoryTarget: 0.92, GlobalBatch: 100}, m)
	var inf *InfeasibleError
	if !errors.As(err, &inf) || !strings.Contains(err.Error(), "128") {
		t.Errorf("global batch 100 on 64: %v", err)
	}

	// A 2T-parameter stand-in on 8 GPUs: fully sharded state alone is
	// 16 B × 2e12 / 8 = 4 TB per GPU. At 128 GPUs it is 250 GB > 0.92 ×
	// 191.5 GB; at 256 GPUs 125 GB, plus with ep = 128 (1.9e12/128 +
	// 1e11 = 1.15e11 parameters per GPU) two gathered layers 4 × 1.15e11 / 94
	// = 4.9 GB, full-AC activations 4096·4096·(94·2 + 60) B = 4.2 GB and
	// fp32 logits with their gradient 4096 × 151936 × 8 B = 5.0 GB: 139 GB
	// × 1.05 = 146 GB = 0.76 of 178.35 GiB. So the answer is 256 GPUs.
	big := planStandInModel(2000, 94, 4096)
	_, err = Search(Request{GPUs: 8, GPUsPerNode: 8, Experts: 128, MemoryTarget: 0.92}, big)
	if !errors.As(err, &inf) {
		t.Fatalf("2T on 8 GPUs: err = %v, want a PlanInfeasibleError", err)
	}
	if inf.Closest == nil || inf.Closest.Score.MemoryFraction <= 0.92 {
		t.Errorf("closest = %+v", inf.Closest)
	}
	if !strings.Contains(inf.Needed, "at least 256 GPUs") {
		t.Errorf("needed = %q, want at least 256 GPUs", inf.Needed)
	}
	t.Log(err)
}

// TestPlanAdmit checks that a filter keeps rejected points out of every stage.
func TestPlanAdmit(t *testing.T) {
	m := planStandInModel(30.5, 48, 2048)
	req := Request{GPUs: 64, GPUsPerNode: 8, Experts: 128, MemoryTarget: 0.92, GlobalBatch: 512,
		Admit: func(p Point) error {
			if p.Layout.Sharding != job.ShardFSDP || p.Layout.KeepGathered || p.Layout.AllreduceLastOnly {
				return fmt.Errorf("not expressible")
			}
			return nil
		}}
	rep, err := Search(req, m)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Plans {
		if req.Admit(r.Point) != nil {
			t.Errorf("plan %s passed the filter", r.Point)
		}
	}
}

// FuzzPlanSearch checks the report invariants over GPU counts, targets and
// global batches.
func FuzzPlanSearch(f *testing.F) {
	f.Add(uint8(3), uint8(92), uint8(0))
	f.Add(uint8(6), uint8(50), uint8(4))
	f.Add(uint8(0), uint8(100), uint8(1))
	f.Add(uint8(5), uint8(10), uint8(3))
	f.Add(uint8(10), uint8(92), uint8(11)) // 8 GPUs, tp 1, 2, pp 1, 2, global batch 16
	m := planStandInModel(7, 16, 2048)
	f.Fuzz(func(t *testing.T, gpuExp, targetPct, gbMult uint8) {
		n := 1 << (gpuExp % 7)
		target := float64(targetPct%101) / 100
		// gpuExp / 7 picks the tensor-parallel degrees searched.
		tps := [][]int{nil, {1, 2}, {1, 2, 4}}[int(gpuExp/7)%3]
		// gbMult / 9 picks the pipeline degrees searched (with tp: pp × tp
		// families; the stand-in's 16 layers + 2 split into 2 and 3 stages).
		pps := [][]int{nil, {1, 2}, {1, 2, 3}}[int(gbMult/9)%3]
		req := Request{GPUs: n, GPUsPerNode: 8, Experts: 64, MemoryTarget: target, GlobalBatch: n * int(gbMult%9), MaxLBS: 16, TPs: tps,
			PPs: pps, Layers: 16}
		rep, err := Search(req, m)
		if target == 0 {
			if err == nil {
				t.Fatal("target 0 accepted")
			}
			return
		}
		if err != nil {
			var inf *InfeasibleError
			if !errors.As(err, &inf) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		planCheckReport(t, req, rep)
	})
}

// outOfMemory marks every point above lbs 2 as not fitting its device (as
// memory outside PyTorch's allocator would), whatever its memory fraction.
type outOfMemory struct{ *planStandIn }

func (o outOfMemory) Evaluate(p Point) (Score, error) {
	s, err := o.planStandIn.Evaluate(p)
	s.DoesNotFit = p.LBS > 2
	return s, err
}

// TestSearchSkipsPointsThatDoNotFit: a point the evaluator says does not fit
// is never a plan, even within the memory target.
func TestSearchSkipsPointsThatDoNotFit(t *testing.T) {
	ev := outOfMemory{planStandInModel(30.5, 48, 2048)}
	for _, exhaustive := range []bool{false, true} {
		rep, err := Search(Request{GPUs: 64, GPUsPerNode: 8, Experts: 128, MemoryTarget: 0.92, MaxLBS: 64, Exhaustive: exhaustive}, ev)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Plans {
			if r.Point.LBS > 2 || r.Score.DoesNotFit {
				t.Fatalf("exhaustive %v: plan %s does not fit", exhaustive, r.Point)
			}
		}
	}
}

// TestCheckHosts: a job lies inside one host or fills whole hosts
// (parallel.NewMesh places rank r on host r / gpus_per_node). On hosts of
// 8: 1 to 8 GPUs and 16, 24, 512 fit; 12 = 1 × 8 + 4 and 20 = 2 × 8 + 4 do
// not, nearest 8 and 16, 16 and 24. On hosts of 4, 6 = 1 × 4 + 2: 4 and 8.
// A search refuses such a request before it evaluates anything.
func TestCheckHosts(t *testing.T) {
	for _, c := range []struct {
		gpus, perNode int
		want          []string // nil: fits
	}{
		{1, 8, nil}, {5, 8, nil}, {7, 8, nil}, {8, 8, nil}, {16, 8, nil}, {24, 8, nil}, {512, 8, nil}, {12, 4, nil},
		{12, 8, []string{"gpus = 12 on hosts of gpus_per_node = 8", "at most 8 GPUs", "a multiple of 8", "12 = 1 × 8 + 4", "8 and 16 GPUs"}},
		{20, 8, []string{"20 = 2 × 8 + 4", "16 and 24 GPUs"}},
		{6, 4, []string{"6 = 1 × 4 + 2", "4 and 8 GPUs"}},
	} {
		err := CheckHosts(c.gpus, c.perNode)
		if (err != nil) != (c.want != nil) {
			t.Errorf("CheckHosts(%d, %d) = %v, want an error: %v", c.gpus, c.perNode, err, c.want != nil)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("CheckHosts(%d, %d) = %q, lacks %q", c.gpus, c.perNode, err, w)
			}
		}
	}
	if _, err := (&Request{GPUs: 12, GPUsPerNode: 8, MemoryTarget: 0.9}).withDefaults(); err == nil || !strings.Contains(err.Error(), "12 = 1 × 8 + 4") {
		t.Errorf("withDefaults on 12 GPUs of hosts of 8: %v, want the hosts' error", err)
	}
}
