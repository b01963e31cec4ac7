package memory_test

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestEstimateGolden pins memory.Estimate's whole result (every event in
// order, the peaks, the per-stage peaks) on layouts that cover the step's
// branches and pipelines. Its golden was written by the Estimate of commit
// 54d6399, before the speed work (label reuse, the replay's category
// array): that earlier implementation is the oracle, and the speed work
// must change no byte.
func TestEstimateGolden(t *testing.T) {
	small, big := builtinModel(t, "qwen3-30b-a3b"), builtinModel(t, "qwen3-235b-a22b")
	fsdp := func(gpus, shard, rep, ep int) job.Layout {
		return job.Layout{GPUs: gpus, DPShard: shard, DPReplicate: rep, EP: ep, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	}
	sel, full, none := moe.AC{Mode: moe.ACSelective}, moe.AC{Mode: moe.ACFull}, moe.AC{Mode: moe.ACNone}
	type tc struct {
		name string
		cfg  *moe.Config
		l    job.Layout
		b    memory.Batch
		o    memory.Options
	}
	zero1 := fsdp(8, 8, 1, 8)
	zero1.Sharding, zero1.ReshardAfterForward = job.ShardZeRO1, false
	keep := fsdp(16, 8, 2, 8)
	keep.KeepGathered, keep.AllreduceLastOnly = true, true
	noRAF := fsdp(8, 8, 1, 1)
	noRAF.ReshardAfterForward = false
	tp := fsdp(16, 8, 1, 8)
	tp.TP, tp.ETP = 2, 1
	sync := fsdp(8, 8, 1, 8)
	sync.GradSyncLastOnly = true
	pipe := func(pp, shard, ep int, sch job.PPSchedule, mbs, v int) job.Layout {
		l := fsdp(pp*shard, shard, 1, ep)
		l.PP, l.PPSchedule, l.PPMicrobatchSize, l.PPVirtualStages = pp, sch, mbs, v
		l.ReshardAfterForward = false
		return l
	}
	compiled := memory.Options{AC: sel, Compile: memory.Compile{Model: true, Loss: true}}
	cases := []tc{
		{"fsdp8 ep8 selective", small, fsdp(8, 8, 1, 8), memory.Batch{LBS: 2, Seq: 4096}, memory.Options{AC: sel}},
		{"fsdp8 ep8 full ga3", small, fsdp(8, 8, 1, 8), memory.Batch{LBS: 5, Seq: 4096, GradAccum: 3}, memory.Options{AC: full}},
		{"zero1 none fixed", small, zero1, memory.Batch{LBS: 1, Seq: 2048}, memory.Options{AC: none, Segments: memory.Fixed}},
		{"keep-gathered ar-last ga2 compiled", small, keep, memory.Batch{LBS: 3, Seq: 4096, GradAccum: 2}, compiled},
		{"no-reshard layer:2 chunks foreach", small, noRAF, memory.Batch{LBS: 2, Seq: 4096}, memory.Options{AC: moe.AC{Mode: moe.ACLayer, Every: 2}, LossChunks: 4, OptimizerImpl: memory.Foreach}},
		{"tp2 etp1", small, tp, memory.Batch{LBS: 2, Seq: 4096}, memory.Options{AC: sel}},
		{"grad-sync-last-only ga2", small, sync, memory.Batch{LBS: 2, Seq: 4096, GradAccum: 2}, memory.Options{AC: sel, ReduceDType: moe.F32}},
		{"pp4 1F1B", big, pipe(4, 8, 8, job.PP1F1B, 1, 1), memory.Batch{LBS: 8, Seq: 4096}, memory.Options{AC: full}},
		{"pp2 GPipe mbs2 ga2", big, pipe(2, 16, 16, job.PPGPipe, 2, 1), memory.Batch{LBS: 4, Seq: 4096, GradAccum: 2}, memory.Options{AC: sel}},
		{"pp8 Interleaved1F1B v2", big, pipe(8, 4, 4, job.PPInterleaved1F1B, 1, 2), memory.Batch{LBS: 16, Seq: 4096}, memory.Options{AC: full}},
	}
	var b strings.Builder
	for _, c := range cases {
		r, err := memory.Estimate(c.cfg, c.l, c.b, c.o)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		h := sha256.New()
		for _, e := range r.Events {
			fmt.Fprintln(h, e)
		}
		fmt.Fprintf(&b, "%s: %d events sha256 %x\n", c.name, len(r.Events), h.Sum(nil)[:12])
		fmt.Fprintf(&b, "  peak allocated %d at %d, reserved %d, by stream %v, saved %v\n", r.Peak.Allocated, r.Peak.Index, r.Peak.Reserved, r.Peak.ReservedByStream, r.Saved)
		cats := make([]string, 0, len(r.Peak.Live))
		for k, v := range r.Peak.Live {
			cats = append(cats, fmt.Sprintf("%s=%d", k, v))
		}
		slices.Sort(cats)
		fmt.Fprintf(&b, "  live %s; stage %d\n", strings.Join(cats, " "), r.Stage)
		for _, s := range r.Stages {
			fmt.Fprintf(&b, "  rank %d stages %v layers %d in flight %d allocated %d reserved %d\n", s.Rank, s.Stages, s.Layers, s.InFlight, s.PeakAllocatedBytes, s.PeakReservedBytes)
		}
	}
	path := filepath.Join("testdata", "estimate.golden")
	if *update {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != string(want) {
		t.Errorf("Estimate changed (go test -update rewrites %s):\n got:\n%s\nwant:\n%s", path, got, want)
	}
}
