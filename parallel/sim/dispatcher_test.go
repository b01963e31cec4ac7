package sim

import (
	"math"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
)

// TestDispatchShare checks DeepEP's rows per (token, slot) against a count
// over every top-k choice (an independent enumeration), and a hand case:
// 4 experts on 2 ranks, top-2: of the 6 pairs, 2 fall on one rank, so a
// token reaches 2·4/6 + 1·2/6 = 5/3 ranks, 5/6 of its 2 rows.
func TestDispatchShare(t *testing.T) {
	if got := dispatchShare(job.DeepEP, &moe.Config{Experts: 4, TopK: 2}, 2); math.Abs(got-5.0/6) > 1e-15 {
		t.Errorf("E 4, ep 2, k 2: %v, want 5/6", got)
	}
	for _, c := range []struct{ e, k, ep int }{{8, 3, 4}, {16, 4, 8}, {12, 2, 3}, {10, 5, 5}} {
		var subsets, ranks int
		var walk func(next, left int, hit map[int]int)
		walk = func(next, left int, hit map[int]int) {
			if left == 0 {
				subsets++
				ranks += len(hit)
				return
			}
			for x := next; x < c.e; x++ {
				r := x / (c.e / c.ep)
				hit[r]++
				walk(x+1, left-1, hit)
				if hit[r]--; hit[r] == 0 {
					delete(hit, r)
				}
			}
		}
		walk(0, c.k, map[int]int{})
		want := float64(ranks) / float64(subsets) / float64(c.k)
		if got := dispatchShare(job.DeepEP, &moe.Config{Experts: c.e, TopK: c.k}, c.ep); math.Abs(got-want) > 1e-12 {
			t.Errorf("E %d, k %d, ep %d: %v, enumeration %v", c.e, c.k, c.ep, got, want)
		}
	}
	// torchtitan's all-to-all sends every row; one EP rank has nothing to dedupe.
	if got := dispatchShare(job.AllToAll, &moe.Config{Experts: 128, TopK: 8}, 8); got != 1 {
		t.Errorf("all_to_all: %v, want 1", got)
	}
	if got := dispatchShare(job.DeepEP, &moe.Config{Experts: 128, TopK: 8}, 1); got != 1 {
		t.Errorf("ep 1: %v, want 1", got)
	}
}

// TestSimulateDeepEPBytes: the dispatcher reaches the simulated step: with
// DeepEP each all-to-all of dispatch and combine carries dispatchShare of
// torchtitan's rows, so the job's all-to-all time falls (other collectives
// may shift too: those in flight on one link class share it).
func TestSimulateDeepEPBytes(t *testing.T) {
	cfg, err := hf.Load("qwen3-30b-a3b")
	if err != nil {
		t.Fatal(err)
	}
	l := job.Layout{GPUs: 8, DPShard: 8, EP: 8, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	in := Input{Spec: job.Spec{Model: cfg, Layout: l, AC: moe.AC{Mode: moe.ACFull}, Batch: job.Batch{LBS: 2, Seq: 4096}, Recipe: job.EagerRecipe()}}
	base, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	in.Dispatcher = job.DeepEP
	deep, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	a, b := base.Breakdown.CommS["all_to_all"], deep.Breakdown.CommS["all_to_all"]
	if !(a > 0 && b < a) {
		t.Errorf("all_to_all time: torchtitan %g s, DeepEP %g s: want DeepEP less", a, b)
	}
}
