package plan

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
)

// TestEnumeratePP: the pipeline families of a dense 6-layer model on 8 GPUs,
// counted by hand. torchtitan's split counts 6 + 2 = 8 effective layers:
// pp 2 splits them evenly into 2 (1F1B) and 4 (Interleaved1F1B, 2 per
// rank) stages of at least 2; pp 4 into 4 (1F1B) but not 8 stages of one;
// pp 8 not at all. pp 2 leaves dp = 4 (dp_replicate 1, 2 or 4), pp 4 dp = 2
// (1 or 2): (3 × 2 schedules + 2 × 1) × 2 micro-batch sizes = 16 layouts,
// each fsdp without reshard-after-forward, under one policy.
func TestEnumeratePP(t *testing.T) {
	cfg := &moe.Config{Layers: 6}
	q, err := (&Request{GPUs: 8, GPUsPerNode: 8, MemoryTarget: 0.92, PPs: []int{1, 2, 4, 8}, Layers: cfg.Layers,
		PPMicrobatchSizes: []int{1, 2}, ACs: []moe.AC{{Mode: moe.ACFull}}}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		pp, r int
		sched job.PPSchedule
		mbs   int
	}
	seen := map[key]int{}
	pipelines := 0
	for _, f := range q.enumerateFamilies(8, false) {
		l := f.layout
		if err := l.Validate(); err != nil {
			t.Errorf("%+v: %v", l, err)
		}
		if l.Stages() == 1 {
			continue
		}
		pipelines++
		if l.Sharding != job.ShardFSDP || l.ReshardAfterForward || l.KeepGathered || l.AllreduceLastOnly {
			t.Errorf("%+v: a pipeline family is fsdp without reshard-after-forward and no accumulation options", l)
		}
		if _, err := l.StageSplit(cfg.Layers); err != nil {
			t.Errorf("%+v: %v", l, err)
		}
		seen[key{l.PP, l.DPReplicate, l.PPSchedule, l.PPMicrobatchSize}]++
	}
	if pipelines != 16 {
		t.Errorf("%d pipeline families, want 16", pipelines)
	}
	for _, k := range []key{{2, 1, job.PP1F1B, 1}, {2, 4, job.PPInterleaved1F1B, 2}, {4, 2, job.PP1F1B, 2}} {
		if seen[k] != 1 {
			t.Errorf("family %+v seen %d times, want once", k, seen[k])
		}
	}
	for _, k := range []key{{4, 1, job.PPInterleaved1F1B, 1}, {8, 1, job.PP1F1B, 1}} {
		if seen[k] != 0 {
			t.Errorf("family %+v searched: its split is not even", k)
		}
	}
	// Asked for, the zero-bubble schedules are searched like
	// Interleaved1F1B (2 stages per rank: pp 2 only): with PPSchedules
	// 1F1B and ZBVZeroBubble the same 16 families, ZBVZeroBubble in
	// Interleaved1F1B's place.
	q.PPSchedules = []job.PPSchedule{job.PP1F1B, job.PPZBVZeroBubble}
	zbv := 0
	for _, f := range q.enumerateFamilies(8, false) {
		if l := f.layout; l.PPSchedule == job.PPZBVZeroBubble {
			zbv++
			if l.PP != 2 || l.PPVirtualStages != 2 || l.Validate() != nil {
				t.Errorf("%+v: a ZBVZeroBubble family is pp 2 with 2 stages per rank", l)
			}
		}
	}
	if zbv != 6 {
		t.Errorf("%d ZBVZeroBubble families, want 6 (pp 2: 3 replica degrees × 2 micro-batch sizes)", zbv)
	}
	for _, bad := range []Request{
		{GPUs: 8, MemoryTarget: 0.92, PPs: []int{2}, Layers: 6, PPSchedules: []job.PPSchedule{"LoopedBFS"}},
		{GPUs: 8, MemoryTarget: 0.92, PPs: []int{0}},
		{GPUs: 8, MemoryTarget: 0.92, PPs: []int{2}},
		{GPUs: 8, MemoryTarget: 0.92, PPs: []int{2}, Layers: 6, PPMicrobatchSizes: []int{512}},
	} {
		if _, err := bad.withDefaults(); err == nil || !strings.Contains(err.Error(), "pp") && !strings.Contains(err.Error(), "layers") {
			t.Errorf("%+v: error %v, want one naming pp, layers or pp_microbatch_size", bad, err)
		}
	}
}

// TestPlanLBSChoicesPipeline: a pipeline's local batches are whole
// micro-batches: with micro-batches of 2 and max 10, the powers of two
// 2, 4, 8 and the limit 10; Interleaved1F1B on pp 4 also needs a multiple
// of its rounds max(1, m/4), so of 1..12 micro-batches 9 and 11 drop out.
func TestPlanLBSChoicesPipeline(t *testing.T) {
	l := job.Layout{PP: 2, PPSchedule: job.PP1F1B, PPMicrobatchSize: 2, PPVirtualStages: 1}
	got := lbsChoices(10, 0, false, 0, func(lbs int) bool { return lbsValid(l, lbs) })
	want := [][2]int{{2, 1}, {4, 1}, {8, 1}, {10, 1}}
	if len(got) != len(want) {
		t.Fatalf("choices %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("choices %v, want %v", got, want)
		}
	}
	q := Request{MaxLBS: 12}
	il := job.Layout{PP: 4, PPSchedule: job.PPInterleaved1F1B, PPMicrobatchSize: 1, PPVirtualStages: 2}
	r := q.lbsRange(il)
	if len(r) != 10 || r[7] != 8 || r[8] != 10 || r[9] != 12 {
		t.Errorf("interleaved pp 4 local batches %v, want 1..8, 10, 12", r)
	}
}

// TestPlanSearchPP: a search with pipelines on the real evaluator returns
// only valid points (planCheckReport checks whole micro-batches, the
// global batch and the degrees), hierarchical and exhaustive, and
// pipelines are among the exhaustive plans.
func TestPlanSearchPP(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	ev := &SimEvaluator{Run: eagerRun(cfg, 256), Device: planSmallDevice(t, 12<<20)}
	req := Request{GPUs: 16, GPUsPerNode: 8, Experts: cfg.Experts, MemoryTarget: 0.92, GlobalBatch: 64, MaxLBS: 8, PPs: []int{1, 2}, Layers: cfg.Layers}
	rep, err := Search(req, ev)
	if err != nil {
		t.Fatal(err)
	}
	planCheckReport(t, req, rep)
	req.Exhaustive = true // every family at the target: the pipelines too
	if rep, err = Search(req, ev); err != nil {
		t.Fatal(err)
	}
	planCheckReport(t, req, rep)
	pipes := 0
	for _, r := range rep.Plans {
		if r.Point.Layout.Stages() > 1 {
			pipes++
		}
	}
	if pipes == 0 {
		t.Errorf("no pipeline among %d plans", len(rep.Plans))
	}
}

// TestMemoryKeyExactPipeline: a pipeline's shared estimate (one replica,
// no host size) equals its own memory.Estimate for several replica counts,
// without and with tp inside the stages.
func TestMemoryKeyExactPipeline(t *testing.T) {
	cfg, dev := qwenOnB200(t)
	e := &SimEvaluator{Run: eagerRun(cfg, 4096), Device: dev}
	for _, tp := range []int{1, 2} {
		for _, rep := range []int{1, 2, 4} {
			l := job.Layout{GPUs: 2 * 4 * tp * rep, PP: 2, DPShard: 4, DPReplicate: rep, TP: tp, EP: 4, Sharding: job.ShardFSDP, GPUsPerNode: 8,
				PPSchedule: job.PP1F1B, PPMicrobatchSize: 1, PPVirtualStages: 1}
			if tp > 1 {
				l.ETP = 1
			}
			p := Point{Layout: l, AC: moe.AC{Mode: moe.ACFull}, LBS: 4, GradAccum: 1}
			got, err := e.MemoryFraction(p)
			if err != nil {
				t.Fatal(err)
			}
			r, err := memory.Estimate(cfg, l, memory.Batch{LBS: 4, Seq: 4096, GradAccum: 1}, memory.Options{AC: p.AC})
			if err != nil {
				t.Fatal(err)
			}
			if want := float64(r.Peak.Reserved) / float64(dev.MemoryBytes); got != want {
				t.Errorf("tp %d, dp_replicate %d: shared estimate %.6f, own %.6f", tp, rep, got, want)
			}
		}
	}
}

// TestPPStageHosts: a pipeline stage is a mesh placed on hosts as a job
// is, so on hosts of 8 at 24 GPUs pp 2 leaves stages of 24 / 2 = 12 GPUs,
// neither inside one host nor whole hosts: not enumerated, and a pp 2
// family carried from 8 GPUs (stages of 4) does not grow to 24; pp 3
// leaves stages of 8 and is enumerated. A 6-layer model splits 6 + 2 = 8
// into 2 stages of 4 (1F1B), a 7-layer one 7 + 2 = 9 into 3 of 3.
func TestPPStageHosts(t *testing.T) {
	request := func(pp, layers int) Request {
		q, err := (&Request{GPUs: 24, GPUsPerNode: 8, MemoryTarget: 0.92, PPs: []int{pp}, Layers: layers, PPSchedules: []job.PPSchedule{job.PP1F1B},
			PPMicrobatchSizes: []int{1}, ACs: []moe.AC{{Mode: moe.ACFull}}}).withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	q := request(2, 6)
	if got, want := q.skipped(24, 2, 1, 1), "pp = 2: a stage's gpus / pp = 24 / 2 = 12 neither lies inside one host nor fills whole hosts (gpus_per_node = 8)"; got != want {
		t.Errorf("pp 2: skipped(24) = %q, want %q", got, want)
	}
	if n := len(q.enumerateFamilies(24, false)); n != 0 {
		t.Errorf("pp 2: %d families at 24 GPUs, want none", n)
	}
	var carried []Result
	for _, f := range q.enumerateFamilies(8, false) {
		carried = append(carried, Result{Point: Point{Layout: f.layout, AC: f.ac, LBS: 1, GradAccum: 1}})
	}
	if len(carried) == 0 {
		t.Fatal("pp 2: no family at 8 GPUs")
	}
	if grown, _ := q.growFamilies(carried, 24, false); len(grown) != 0 {
		t.Errorf("pp 2: %d families grown to 24 GPUs (stages of 12), want none", len(grown))
	}
	q = request(3, 7)
	if got := q.skipped(24, 3, 1, 1); got != "" {
		t.Errorf("pp 3: skipped(24) = %q, want none (stages of 8)", got)
	}
	if len(q.enumerateFamilies(24, false)) == 0 {
		t.Error("pp 3: no family at 24 GPUs")
	}
}
