package plan

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/moescope/moescope/memory/verdict"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
)

// TestEnumeratePPTP: pipelines with tensor parallelism inside their
// stages, counted by hand for the tiny model (2 layers: pp 2 splits its
// 2 + 2 effective layers into 2 stages of 2; 4 experts) on 16 GPUs, 8 per
// host, one schedule, micro-batch size and policy. pp 2 × tp 2 leaves
// dp = 4; EP borrows from dp_shard·tp:
//
//	dp_replicate 1, dp_shard 4 (dp_shard·tp = 8): ep 1; ep 2 with etp 1, 2; ep 4 with etp 1, 2 → 5
//	dp_replicate 2, dp_shard 2 (4): ep 1; ep 2 with etp 1, 2; ep 4 with etp 1 (ep·etp = 8 ∤ 4) → 4
//	dp_replicate 4, dp_shard 1 (2): ep 1; ep 2 with etp 1 (4 ∤ 2) → 2
//
// 11 families, each fsdp without reshard-after-forward (torchtitan's
// default under pp), each stage a dp × tp mesh of 8 GPUs; tp 16 exceeds a
// host and is never searched.
func TestEnumeratePPTP(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	q, err := (&Request{GPUs: 16, GPUsPerNode: 8, Experts: cfg.Experts, MemoryTarget: 0.92, PPs: []int{1, 2}, TPs: []int{1, 2, 16},
		Layers: cfg.Layers, PPSchedules: []job.PPSchedule{job.PP1F1B}, PPMicrobatchSizes: []int{1},
		ACs: []moe.AC{{Mode: moe.ACFull}}, Shardings: []job.Sharding{job.ShardFSDP}}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	type key struct{ r, s, ep, etp int }
	seen := map[key]int{}
	for _, f := range q.enumerateFamilies(16, false) {
		l := f.layout
		if l.TPDegree() > 8 {
			t.Errorf("%+v: tp beyond a host", l)
		}
		if l.Stages() == 1 || l.TPDegree() == 1 {
			continue
		}
		if err := l.Validate(); err != nil {
			t.Errorf("%+v: %v", l, err)
		}
		if err := l.CheckModel(cfg); err != nil {
			t.Errorf("%+v: %v", l, err)
		}
		if l.Sharding != job.ShardFSDP || l.ReshardAfterForward || l.StageGPUs() != 8 {
			t.Errorf("%+v: want fsdp without reshard-after-forward on stages of 8 GPUs", l)
		}
		seen[key{l.DPReplicate, l.DPShard, l.EP, max(l.ETP, 1)}]++
	}
	want := map[key]int{
		{1, 4, 1, 1}: 1, {1, 4, 2, 1}: 1, {1, 4, 2, 2}: 1, {1, 4, 4, 1}: 1, {1, 4, 4, 2}: 1,
		{2, 2, 1, 1}: 1, {2, 2, 2, 1}: 1, {2, 2, 2, 2}: 1, {2, 2, 4, 1}: 1,
		{4, 1, 1, 1}: 1, {4, 1, 2, 1}: 1,
	}
	if !reflect.DeepEqual(seen, want) {
		t.Errorf("pp 2 × tp 2 families (dp_replicate, dp_shard, ep, etp): %v, want %v", seen, want)
	}
}

// onlyPPTP admits only pipelines with tensor parallelism inside their
// stages, so that a search compares those families alone.
func onlyPPTP(p Point) error {
	if l := p.Layout; l.Stages() == 1 || l.TPDegree() == 1 {
		return fmt.Errorf("pp = %d, tp = %d: the test searches pp > 1 with tp > 1 only", l.Stages(), l.TPDegree())
	}
	return nil
}

// TestPlanSimPPTPSearchEqualsExhaustive: on the real evaluator (memory
// timeline, pipeline simulator), a small pp × tp request: the hierarchical
// search's best equals the exhaustive scan's, both among pp × tp families
// only (Admit) and with every degree of pp 1, 2 and tp 1, 2 competing; the
// largest fitting local batch of every pp × tp family equals a scan of
// every local batch.
func TestPlanSimPPTPSearchEqualsExhaustive(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	// At seq 256 every pp × tp family of the tiny model fits all of 1..32
	// on 12 MiB or none on 4 (the allocator's segments step its memory);
	// at seq 1024 on 6 MiB their limits spread over the range, so memory
	// decides the pp × tp search. With every degree, 12 MiB at seq 256
	// binds the flat families (none fits lbs ≈ 5, full ≈ 12).
	small := &SimEvaluator{Run: eagerRun(cfg, 1024), Device: planSmallDevice(t, 6<<20)}
	for _, admit := range []func(Point) error{onlyPPTP, nil} {
		ev := small
		req := Request{GPUs: 16, GPUsPerNode: 8, Experts: cfg.Experts, MemoryTarget: 0.92, GlobalBatch: 64, MaxLBS: 8,
			PPs: []int{1, 2}, TPs: []int{1, 2}, Layers: cfg.Layers, Admit: admit}
		if admit == nil {
			ev = &SimEvaluator{Run: eagerRun(cfg, 256), Device: planSmallDevice(t, 12<<20)}
			// fsdp and two policies: the other modes and selective AC
			// multiply the flat families' points (pipelines are searched
			// with fsdp alone), not what is checked.
			req.Shardings, req.ACs = []job.Sharding{job.ShardFSDP}, []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACFull}}
		}
		hier, err := Search(req, ev)
		if err != nil {
			t.Fatal(err)
		}
		planCheckReport(t, req, hier)
		req.Exhaustive = true
		exh, err := Search(req, ev)
		if err != nil {
			t.Fatal(err)
		}
		planCheckReport(t, req, exh)
		t.Logf("pp×tp only %v: hierarchical %s %.0f TPS (%d simulated), exhaustive %s %.0f TPS (%d simulated)",
			admit != nil, hier.Best.Point, hier.Best.Score.TPS, hier.Simulated, exh.Best.Point, exh.Best.Score.TPS, exh.Simulated)
		if hier.Best.Point != exh.Best.Point {
			t.Errorf("pp×tp only %v: hierarchical best %s, exhaustive %s", admit != nil, hier.Best.Point, exh.Best.Point)
		}
		if admit != nil {
			for _, r := range exh.Plans {
				if onlyPPTP(r.Point) != nil {
					t.Fatalf("plan %s is not pp × tp", r.Point)
				}
			}
		}
	}

	ev := small
	q, err := (&Request{GPUs: 16, GPUsPerNode: 8, Experts: cfg.Experts, MemoryTarget: 0.92, MaxLBS: 32, PPs: []int{2}, TPs: []int{2}, Layers: cfg.Layers}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	fams := q.enumerateFamilies(16, false)
	bound := 0 // families whose limit lies inside the range scanned
	for _, f := range fams {
		got, _, err := q.sizeByMemory(ev, f, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		for _, lbs := range q.lbsRange(f.layout) {
			fr, err := ev.MemoryFraction(Point{f.layout, f.ac, lbs, 1})
			if err != nil {
				t.Fatal(err)
			}
			if verdict.WithinTarget(fr, q.MemoryTarget) {
				want = lbs
			}
		}
		if got != want {
			t.Errorf("%s: sizeByMemory %d, scan %d", Point{f.layout, f.ac, got, 1}, got, want)
		}
		if r := q.lbsRange(f.layout); want > 0 && want < r[len(r)-1] {
			bound++
		}
	}
	if len(fams) == 0 || bound == 0 {
		t.Fatalf("%d pp × tp families at 16 GPUs, %d with a memory limit inside the local batches scanned", len(fams), bound)
	}
	t.Logf("%d pp × tp families sized, %d limited by memory inside the scan", len(fams), bound)
}

// TestPlanPPTPSameUnderGOMAXPROCS: a pp × tp search reports the same under
// GOMAXPROCS 1 and 2.
func TestPlanPPTPSameUnderGOMAXPROCS(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	var reps []*Report
	for _, procs := range []int{1, 2} {
		runtime.GOMAXPROCS(procs)
		ev := &SimEvaluator{Run: eagerRun(cfg, 256), Device: planSmallDevice(t, 12<<20)} // fresh caches
		rep, err := Search(Request{GPUs: 32, GPUsPerNode: 8, Experts: cfg.Experts, MemoryTarget: 0.92, GlobalBatch: 128, MaxLBS: 8,
			PPs: []int{1, 2}, TPs: []int{1, 2}, Layers: cfg.Layers}, ev)
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, rep)
	}
	if !reflect.DeepEqual(reps[0], reps[1]) {
		t.Errorf("GOMAXPROCS 1: best %s (%d simulated); 2: best %s (%d simulated)", reps[0].Best.Point, reps[0].Simulated, reps[1].Best.Point, reps[1].Simulated)
	}
}

// TestPlanPPTPBadInput: a search whose degrees give no layout says which
// degree breaks which bound, and one whose every family the caller
// refuses (tp 8 for the tiny model's 4 heads and 2 KV heads, under pp 2)
// says why; both are InfeasibleErrors.
func TestPlanPPTPBadInput(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	ev := planStandInModel(1, cfg.Layers, 32)
	checkModel := func(p Point) error { return p.Layout.CheckModel(cfg) }
	for _, c := range []struct {
		req  Request
		want []string
	}{
		{Request{PPs: []int{2}, TPs: []int{16}}, []string{"pp × tp = 2 × 16 does not divide gpus = 16"}},
		{Request{PPs: []int{1}, TPs: []int{16}}, []string{"tp = 16 exceeds a host (gpus_per_node = 8)"}},
		{Request{PPs: []int{4}, TPs: []int{2}}, []string{"pp = 4: 2 layers + 2", "[1F1B Interleaved1F1B]"}},
		{Request{PPs: []int{2}, TPs: []int{2}, Shardings: []job.Sharding{job.ShardZeRO1}}, []string{"pp = 2 is searched with sharding fsdp only"}},
		{Request{PPs: []int{2}, TPs: []int{8}, Admit: checkModel}, []string{"every candidate was refused", "tp = 8 does not divide heads = 4", "tp = 8 does not divide kv_heads = 2"}},
	} {
		req := c.req
		req.GPUs, req.GPUsPerNode, req.Experts, req.MemoryTarget, req.Layers = 16, 8, cfg.Experts, 0.92, cfg.Layers
		for _, exhaustive := range []bool{false, true} {
			req.Exhaustive = exhaustive
			_, err := Search(req, ev)
			var inf *InfeasibleError
			if !errors.As(err, &inf) {
				t.Errorf("%+v: err = %v, want an InfeasibleError", c.req, err)
				continue
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("pp %v tp %v exhaustive %v: %q lacks %q", c.req.PPs, c.req.TPs, exhaustive, err, w)
				}
			}
		}
	}
}

// failsTP8 is the stand-in with an evaluator that cannot estimate tp 8
// (as memory.Estimate refuses a tp the model's heads do not divide).
type failsTP8 struct{ *planStandIn }

func (f failsTP8) MemoryFraction(p Point) (float64, error) {
	if p.Layout.TPDegree() == 8 {
		return 0, fmt.Errorf("tp = 8 does not divide heads = 4")
	}
	return f.planStandIn.MemoryFraction(p)
}

func (f failsTP8) Evaluate(p Point) (Score, error) {
	if p.Layout.TPDegree() == 8 {
		return Score{}, fmt.Errorf("tp = 8 does not divide heads = 4")
	}
	return f.planStandIn.Evaluate(p)
}

// TestPlanProbeSkipsUnestimable: a family the evaluator cannot estimate
// does not fit in the first scale's probe (as the stages leave out the
// families Admit refuses), rather than failing the search. A 120B
// stand-in under fsdp fits no layout on 8 GPUs (16 B × 120e9 / 8 = 240 GB
// of fully sharded state > 0.92 × 178.35 GiB) but fits on 16; tp 8 cannot
// be estimated and is refused by Admit: the search plans on 16 GPUs.
func TestPlanProbeSkipsUnestimable(t *testing.T) {
	ev := failsTP8{planStandInModel(120, 48, 2048)}
	req := Request{GPUs: 16, GPUsPerNode: 8, Experts: 128, MemoryTarget: 0.92, MaxLBS: 16, TPs: []int{1, 8}, PPs: []int{1, 2}, Layers: 48,
		Shardings: []job.Sharding{job.ShardFSDP}, Admit: func(p Point) error {
			if p.Layout.TPDegree() == 8 {
				return fmt.Errorf("tp = 8 refused")
			}
			return nil
		}}
	rep, err := Search(req, ev)
	if err != nil {
		t.Fatal(err)
	}
	planCheckReport(t, req, rep)
	if rep.Stages[0].GPUs != 16 {
		t.Errorf("stage 1 at %d GPUs, want 16 (nothing fits on 8)", rep.Stages[0].GPUs)
	}
}

// TestPlanStageCapPerDPRank: with a global batch of one sequence per GPU,
// a stage before the target ranks each family at no more than its
// data-parallel rank's share of it, 1 × tp × pp sequences: a pipeline of
// micro-batches of 2 is usable (it was capped at one sequence per GPU,
// below its one micro-batch, and the search failed), and pp × tp
// families are ranked above one sequence: each fits every local batch on
// 12 MiB at seq 256 (TestPlanSimPPTPSearchEqualsExhaustive), so a stage
// ranks it at its largest, the share, 4. Every plan consumes the global
// batch.
func TestPlanStageCapPerDPRank(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	ev := &SimEvaluator{Run: eagerRun(cfg, 256), Device: planSmallDevice(t, 12<<20)}
	req := Request{GPUs: 16, GPUsPerNode: 8, Experts: cfg.Experts, MemoryTarget: 0.92, GlobalBatch: 16, MaxLBS: 8,
		PPs: []int{1, 2}, TPs: []int{1, 2}, Layers: cfg.Layers, PPMicrobatchSizes: []int{2}, Admit: onlyPPTP}
	rep, err := Search(req, ev)
	if err != nil {
		t.Fatal(err)
	}
	planCheckReport(t, req, rep)
	if len(rep.Stages) < 2 {
		t.Fatalf("%d stages, want a stage before the target", len(rep.Stages))
	}
	for _, r := range rep.Stages[0].Survivors {
		l := r.Point.Layout
		if share := dpShare(l); r.Point.LBS > share || r.Point.LBS%l.PPMicrobatchSize != 0 {
			t.Errorf("stage 1 ranks %s above its share %d of the global batch, or not in micro-batches", r.Point, share)
		}
	}
	if best := rep.Stages[0].Survivors[0].Point; best.LBS != 4 {
		t.Errorf("stage 1's best %s, want it at lbs 4 = 1 sequence per GPU × tp 2 × pp 2", best)
	}
}
