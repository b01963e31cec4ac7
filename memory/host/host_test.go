package host

import (
	"testing"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
)

// TestPeak: the host bytes are the float32 estimate's peak allocated
// bytes doubled (HeapFactor), and the report is that estimate; a batch
// memory.Estimate refuses is refused with its error.
func TestPeak(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	l := job.Layout{GPUs: 1, Sharding: job.ShardDDP}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	ac := moe.AC{Mode: moe.ACFull}
	b := memory.Batch{LBS: 2, Seq: 16}
	got, rep, err := Peak(cfg, l, b, ac)
	if err != nil {
		t.Fatal(err)
	}
	want, err := memory.Estimate(cfg, l, b, memory.Options{Precision: moe.ReferencePrecision, AC: ac})
	if err != nil {
		t.Fatal(err)
	}
	if got != 2*float64(want.Peak.Allocated) || rep.Peak.Allocated != want.Peak.Allocated || rep.Peak.Reserved != want.Peak.Reserved {
		t.Errorf("Peak = %g (report peak %d), want 2 × %d", got, rep.Peak.Allocated, want.Peak.Allocated)
	}
	if _, _, err := Peak(cfg, l, memory.Batch{LBS: 0, Seq: 16}, ac); err == nil {
		t.Error("lbs 0: no error")
	}
}
