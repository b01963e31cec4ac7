package memory

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
)

// TestHostPeak: the host bytes are the float32 estimate's peak allocated
// bytes doubled (HeapFactor), and the report is that estimate; a batch
// Estimate refuses is refused with its error.
func TestHostPeak(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	l := job.Layout{GPUs: 1, Sharding: job.ShardDDP}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	ac := moe.AC{Mode: moe.ACFull}
	b := Batch{LBS: 2, Seq: 16}
	got, rep, err := HostPeak(cfg, l, b, ac)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Estimate(cfg, l, b, Options{Precision: moe.ReferencePrecision, AC: ac})
	if err != nil {
		t.Fatal(err)
	}
	if got != 2*float64(want.Peak.Allocated) || rep.Peak.Allocated != want.Peak.Allocated || rep.Peak.Reserved != want.Peak.Reserved {
		t.Errorf("HostPeak = %g (report peak %d), want 2 × %d", got, rep.Peak.Allocated, want.Peak.Allocated)
	}
	if _, _, err := HostPeak(cfg, l, Batch{LBS: 0, Seq: 16}, ac); err == nil {
		t.Error("lbs 0: no error")
	}
}
