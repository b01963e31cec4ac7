package main

import (
	"math"
	"strings"
	"testing"
)

// TestCPFlags: train refuses by name what its CP ranks do not run (cp
// with tp, the ptrr balancer, the schedule's missing K/V exchanges);
// simulate prints every factor of a contradiction; a method not modelled
// is refused by name.
func TestCPFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"train", "--model", "tiny", "--gpus", "4", "--cp", "2", "--tp", "2", "--seq", "16", "--lbs", "1", "--steps", "1"},
			"--cp = 2 with --tp 2 --pp 1: numeric CP ranks run without tensor or pipeline parallelism"},
		{[]string{"train", "--model", "tiny", "--gpus", "2", "--cp", "2", "--cp-load-balancer", "ptrr", "--seq", "16", "--lbs", "1", "--steps", "1"},
			"cp_load_balancer = ptrr: FlexAttention's block assignment is not built"},
		{[]string{"train", "--model", "tiny", "--gpus", "2", "--cp", "2", "--seq", "16", "--lbs", "1", "--steps", "1", "--schedule"},
			"--schedule with --cp 2: the schedule does not list the cp ranks' K/V exchanges yet"},
		{[]string{"train", "--model", "tiny", "--gpus", "2", "--cp", "2", "--seq", "6", "--lbs", "1", "--steps", "1"},
			"seq = 6 is not divisible by tp × 2·cp"},
		{[]string{"simulate", "--model", "llama3-8b", "--gpus", "64", "--cp", "3", "--seq", "8192", "--lbs", "1"},
			"gpus = 64 is not divisible by dp_replicate × cp × tp = 1 × 3 × 1 = 3"},
		{[]string{"simulate", "--model", "llama3-8b", "--gpus", "8", "--cp", "2", "--cp-method", "a2a", "--seq", "8192", "--lbs", "1"},
			"cp_method = a2a"},
	} {
		_, err := runCmd(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v; want an error containing %q", c.args, err, c.want)
		}
	}
}

// TestTrainCP: cp ranks print the losses of one rank reading the same
// sequences whole (DESIGN's batch contract: cp adds no data-parallel
// rank), alone, with FSDP over dp_shard × cp and with EP borrowing the cp
// ranks, within 1e-5 relative (the ring's and the reduce-scatter's
// summation orders); TPS counts a cp rank's own tokens, 1/cp of its
// sequences' (torchtitan v0.2.2 73a0e69 components/metrics.py divides by
// non_data_parallel_size = cp·tp·pp): 3 steps × 2 sequences × 16 tokens
// ÷ cp, 48 per rank at cp 2, 24 at cp 4.
func TestTrainCP(t *testing.T) {
	one := trainJSON(t, "--seq", "16", "--gpus", "1", "--lbs", "2", "--steps", "3")
	oneAcc := trainJSON(t, "--seq", "16", "--gpus", "1", "--lbs", "2", "--grad-accum", "2", "--steps", "3")
	for _, c := range []struct {
		want trainReport
		own  float64 // tokens per rank
		args []string
	}{
		{one, 48, []string{"--gpus", "2", "--cp", "2"}},
		{one, 48, []string{"--gpus", "2", "--cp", "2", "--cp-method", "p2p", "--cp-load-balancer", "none"}},
		{one, 24, []string{"--gpus", "4", "--cp", "4", "--cp-method", "alltoall"}},
		{oneAcc, 48, []string{"--gpus", "4", "--cp", "2", "--dp-shard", "2", "--cp-method", "p2p"}},
		{one, 48, []string{"--gpus", "2", "--cp", "2", "--ep", "2"}},
	} {
		got := trainJSON(t, append([]string{"--seq", "16", "--lbs", "2", "--steps", "3"}, c.args...)...)
		if len(got.Losses) != 3 {
			t.Fatalf("%v: losses %v, want 3", c.args, got.Losses)
		}
		for i, l := range c.want.Losses {
			if math.Abs(got.Losses[i]-l) > 1e-5*math.Abs(l) {
				t.Errorf("%v step %d: loss %.9g, one rank %.9g", c.args, i+1, got.Losses[i], l)
			}
		}
		if own := got.TPS * got.Seconds; math.Abs(own-c.own) > 1e-9*c.own {
			t.Errorf("%v: tps × seconds = %g tokens per rank, want %g", c.args, own, c.own)
		}
	}
}
