package plan

import (
	"slices"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// TestAutoCPs: 1 and the powers of two up to a host that divide gpus.
func TestAutoCPs(t *testing.T) {
	if got := AutoCPs(64, 8); !slices.Equal(got, []int{1, 2, 4, 8}) {
		t.Errorf("AutoCPs(64, 8) = %v, want [1 2 4 8]", got)
	}
	if got := AutoCPs(12, 8); !slices.Equal(got, []int{1, 2, 4}) {
		t.Errorf("AutoCPs(12, 8) = %v, want [1 2 4]", got)
	}
	if got := AutoCPs(3, 8); got != nil {
		t.Errorf("AutoCPs(3, 8) = %v, want none", got)
	}
}

// TestSearchPicksCP: Llama 3 8B at 131072 tokens on 64 H100s (the issue's
// case). Without CP a rank holds a whole sequence: at full checkpointing
// the 32 blocks' inputs are 32 × 131072 × 4096 × 2 bytes = 32 GiB and the
// logits 131072 × 128256 × 2 bytes = 31.3 GiB (twice that in the loss's
// f32), past the 0.92 × 79.11 GiB target; nothing fits, so the search
// turns to cp on its own, says so, and returns a plan with cp > 1. Given
// cp 1 only, it finds nothing.
func TestSearchPicksCP(t *testing.T) {
	if testing.Short() {
		t.Skip("searches 64 GPUs")
	}
	cfg, err := hf.Load("llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := hw.LookupDevice("h100")
	if err != nil {
		t.Fatal(err)
	}
	run := job.DefaultSpec(cfg)
	run.Seq = 131072
	if err := run.Recipe.Resolve(); err != nil {
		t.Fatal(err)
	}
	ev := &SimEvaluator{Run: run, Device: dev}
	req := Request{GPUs: 64, GPUsPerNode: 8, MemoryTarget: 0.92, Admit: TPAdmit(cfg, 131072, nil)}
	rep, err := Search(req, ev)
	if err != nil {
		t.Fatal(err)
	}
	if cp := rep.Best.Point.Layout.CPDegree(); cp < 2 || !strings.Contains(rep.CPNote, "context parallelism") {
		t.Errorf("best %v (cp %d), note %q; want cp > 1 and a note", rep.Best.Point, cp, rep.CPNote)
	}
	req.CPs = []int{1}
	if _, err := Search(req, ev); err == nil {
		t.Error("cp 1 only: a plan; want none to fit")
	}
}

// TestSearchCPWithPP: asked for pp 2 and cp 2 only, the search enumerates
// and prices layouts with context parallelism inside pipeline stages
// (Llama 3 8B at 32768 tokens on 16 H100s: pp 2 × cp 2 leaves 4
// data-parallel ranks), and its best plan has both.
func TestSearchCPWithPP(t *testing.T) {
	if testing.Short() {
		t.Skip("searches 16 GPUs")
	}
	cfg, err := hf.Load("llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := hw.LookupDevice("h100")
	if err != nil {
		t.Fatal(err)
	}
	run := job.DefaultSpec(cfg)
	run.Seq = 32768
	if err := run.Recipe.Resolve(); err != nil {
		t.Fatal(err)
	}
	ev := &SimEvaluator{Run: run, Device: dev}
	req := Request{GPUs: 16, GPUsPerNode: 8, MemoryTarget: 0.92, PPs: []int{2}, CPs: []int{2}, Layers: cfg.Layers, Admit: TPAdmit(cfg, 32768, nil)}
	rep, err := Search(req, ev)
	if err != nil {
		t.Fatal(err)
	}
	if l := rep.Best.Point.Layout; l.Stages() != 2 || l.CPDegree() != 2 {
		t.Errorf("best %s; want pp 2 and cp 2", l.Label())
	}
}
