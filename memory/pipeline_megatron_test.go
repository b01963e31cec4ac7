package memory

import (
	"fmt"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// p2pString writes events as "+in 2F0" (a received input allocated),
// "+grad 2B0" (a received gradient) and "-out 0F1" (an output freed).
func p2pString(es []p2pEvent) string {
	var parts []string
	for _, e := range es {
		parts = append(parts, [...]string{"+in ", "+grad ", "-out "}[e.kind]+e.a.String())
	}
	return strings.Join(parts, ",")
}

// TestMegatronP2P compares the p2p events of one rank with those stepped
// through by hand in Megatron-Core's schedules.py (the commit
// job.PPMegatron cites):
//   - Interleaved1F1B, pp 2, v 2, m 4, rank 0 (stages 0 and 2 of 4; order
//     0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3):
//     warm-up (2 − 0 − 1)·2 + (2 − 1)·2 = 4 forwards. Stage 0 receives no
//     input. After each forward the next forward's input is received (the
//     third and fourth forwards' and the seventh and eighth, stage 2's),
//     a warm-up forward's output is freed at once, and after the fourth
//     the first backward's gradient (2B0's) is received; after each
//     backward the next backward's gradient is received and the output of
//     the steady-state forward paired with it (the one just before it) is
//     freed.
//   - 1F1B, pp 2, m 3, rank 0 (stage 0 of 2; order 0F0 0F1 0B0 0F2 0B1
//     0B2): warm-up min(2 − 0 − 1, 3) = 1 forward, whose output is freed
//     after its send; each steady forward (0F1, 0F2) receives its paired
//     backward's gradient before its output is freed; the cool-down
//     backward 0B2 receives its gradient right before it.
//   - 1F1B rank 1 (stage 1, the last: order 1F0 1B0 1F1 1B1 1F2 1B2):
//     warm-up 0; each forward's input right before it; no gradient, no
//     output.
func TestMegatronP2P(t *testing.T) {
	for _, c := range []struct {
		s             job.PPSchedule
		pp, v, m, r   int
		before, after []string
	}{
		{job.PPInterleaved1F1B, 2, 2, 4, 0,
			[]string{"", "", "", "", "", "", "", "", "", "", "", "", "", "", "", ""},
			[]string{"-out 0F0", "+in 2F0,-out 0F1", "+in 2F1,-out 2F0", "-out 2F1,+grad 2B0", "",
				"+grad 2B1,-out 0F2", "+in 2F2", "+grad 0B0,-out 0F3", "+in 2F3", "+grad 0B1,-out 2F2", "",
				"+grad 2B2,-out 2F3", "+grad 2B3", "+grad 0B2", "+grad 0B3", ""}},
		{job.PP1F1B, 2, 1, 3, 0,
			[]string{"", "", "", "", "", "+grad 0B2"},
			[]string{"-out 0F0", "+grad 0B0,-out 0F1", "", "+grad 0B1,-out 0F2", "", ""}},
		{job.PP1F1B, 2, 1, 3, 1,
			[]string{"+in 1F0", "", "+in 1F1", "", "+in 1F2", ""},
			[]string{"", "", "", "", "", ""}},
	} {
		order, err := job.PipelineOrder(c.s, c.pp, c.v, c.m)
		if err != nil {
			t.Fatal(err)
		}
		warm := job.MegatronWarmup(c.s, c.r, c.pp, c.v, c.m)
		before, after := megatronP2P(c.s, order[c.r], c.pp*c.v, warm)
		for k, a := range order[c.r] {
			if got := p2pString(before[k]); got != c.before[k] {
				t.Errorf("%s pp %d m %d rank %d: before %v: %q, want %q", c.s, c.pp, c.m, c.r, a, got, c.before[k])
			}
			if got := p2pString(after[k]); got != c.after[k] {
				t.Errorf("%s pp %d m %d rank %d: after %v: %q, want %q", c.s, c.pp, c.m, c.r, a, got, c.after[k])
			}
		}
	}
}

// TestMegatronPipelineHeld checks the most point-to-point bytes a rank
// holds at once (received inputs and gradients, kept outputs), in units
// of one message dx = T×D, against counts derived by hand from the
// orders of TestMegatronP2P:
//   - Interleaved1F1B, pp 2, v 2, m 4. Megatron: rank 0 (stages 0, 2)
//     holds at most 4 (after 0F2: stage 2's inputs of micro-batches 0 and
//     1, 2B0's gradient, 0F2's output not yet freed); rank 1 (stages 1, 3)
//     6 (after 1F2: stage 1's inputs 0 to 3, 1B0's gradient and 1F2's
//     output). PyTorch: the setup's m buffers per direction per stage
//     boundary plus the kept outputs of the micro-batches in flight on
//     non-last stages: rank 0 4 + 4 + 4 = 12 and 5 outputs (5 in flight,
//     both stages send), 17; rank 1 4 + 4 + 4 = 12 and 3 outputs (stage
//     1's: 1F0, 1F1, 1F2 before 1B0), 15.
//   - 1F1B, pp 2, m 3. Megatron: rank 0 2 (0F1's output and 0B0's
//     gradient), rank 1 1 (one input). PyTorch: rank 0 3 gradient buffers
//     and 2 outputs in flight, 5; rank 1 3 input buffers.
//
// It also checks that Megatron's peak is no higher than PyTorch's.
func TestMegatronPipelineHeld(t *testing.T) {
	cfg := sixLayerMoE()
	const seq = 8
	for _, c := range []struct {
		l           job.Layout
		lbs         int
		torch, megs []int64 // per rank, in messages
	}{
		{job.Layout{GPUs: 2, PP: 2, PPSchedule: job.PPInterleaved1F1B, Sharding: job.ShardZeRO1}, 4, []int64{17, 15}, []int64{4, 6}},
		{job.Layout{GPUs: 2, PP: 2, Sharding: job.ShardZeRO1}, 3, []int64{5, 3}, []int64{2, 1}},
	} {
		dx := int64(seq) * int64(cfg.Hidden) * moe.DefaultPrecision.Activation.Bytes()
		o := Options{AC: moe.AC{Mode: moe.ACNone}}
		b := Batch{LBS: c.lbs, Seq: seq, GradAccum: 2}
		var peaks [2][]int64
		for i, impl := range []job.PPImpl{job.PPTorch, job.PPMegatron} {
			l := c.l
			l.PPImpl = impl
			l = pipelineLayout(t, l)
			want := c.torch
			if impl == job.PPMegatron {
				want = c.megs
			}
			for r := range l.PP {
				rr, err := pipelineRankReport(cfg, l, b, o, r)
				if err != nil {
					t.Fatal(err)
				}
				var cur, most int64
				for _, e := range rr.Events {
					if !strings.HasPrefix(e.Label, "p2p_") {
						continue
					}
					cur += e.Delta()
					most = max(most, cur)
				}
				name := fmt.Sprintf("%s %s m %d rank %d", impl, l.PPSchedule, c.lbs, r)
				if most != want[r]*dx {
					t.Errorf("%s: at most %d B of p2p tensors live (%.2f messages), want %d messages of %d B", name, most, float64(most)/float64(dx), want[r], dx)
				}
				if impl == job.PPMegatron && cur != 0 {
					t.Errorf("%s: %d B of p2p tensors live at the step's end, want none", name, cur)
				}
				peaks[i] = append(peaks[i], rr.Peak.Allocated)
			}
		}
		for r := range peaks[0] {
			if peaks[1][r] > peaks[0][r] {
				t.Errorf("%s rank %d: Megatron's peak %d B above PyTorch's %d B", c.l.PPSchedule, r, peaks[1][r], peaks[0][r])
			}
		}
	}
}
