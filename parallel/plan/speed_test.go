package plan

import (
	"reflect"
	"runtime"
	"testing"

	"github.com/moescope/moescope/memory/verdict"
	"github.com/moescope/moescope/moe/hf"
)

// TestPlanSimSizeByMemoryScan: on the real evaluator (the memory timeline
// through the allocator model), the largest fitting local batch the search
// finds for every family of a stage equals a scan of every local batch,
// the plain loop it shortcuts.
func TestPlanSimSizeByMemoryScan(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	ev := &SimEvaluator{Run: eagerRun(cfg, 256), Device: planSmallDevice(t, 12<<20)}
	q, err := (&Request{GPUs: 8, GPUsPerNode: 8, Experts: cfg.Experts, MemoryTarget: 0.92, MaxLBS: 24, PPs: []int{1, 2}, Layers: cfg.Layers}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	fams := q.enumerateFamilies(8, false)
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
	}
	t.Logf("%d families sized", len(fams))
}

// TestPlanSameUnderGOMAXPROCS: the search's report does not depend on how
// many goroutines evaluate (GOMAXPROCS 1 and 2, the worker default).
func TestPlanSameUnderGOMAXPROCS(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	var reps []*Report
	for _, procs := range []int{1, 2} {
		runtime.GOMAXPROCS(procs)
		ev := &SimEvaluator{Run: eagerRun(cfg, 256), Device: planSmallDevice(t, 12<<20)} // fresh caches
		rep, err := Search(Request{GPUs: 32, GPUsPerNode: 8, Experts: cfg.Experts, MemoryTarget: 0.92, GlobalBatch: 128, MaxLBS: 8, PPs: []int{1, 2}, Layers: cfg.Layers}, ev)
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, rep)
	}
	if !reflect.DeepEqual(reps[0], reps[1]) {
		t.Errorf("GOMAXPROCS 1: best %s (%d simulated); 2: best %s (%d simulated)", reps[0].Best.Point, reps[0].Simulated, reps[1].Best.Point, reps[1].Simulated)
	}
}
