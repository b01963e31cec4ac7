package report

import (
	"fmt"
	"math"
	"strings"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/plan"
)

// Explain is the two-line explanation of the best plan that plan's table
// prints and the page shows: what it is, the batch it steps (sequences of
// seq tokens) and what it predicts, then where its step time goes and what
// it beat.
func Explain(rep *plan.Report, dev hw.Device, seq int) [2]string {
	b := rep.Best
	l, p := b.Point.Layout, b.Point
	var shape string
	// FSDP shards over dp_shard × cp (job.Layout.FoldCP); the options say cp.
	f := l.FoldCP()
	switch {
	case f.DPShard == 1:
		shape = fmt.Sprintf("pure data parallelism over %d replicas", l.DPReplicate)
	case l.DPReplicate == 1 && l.TPDegree() == 1 && l.Stages() == 1:
		shape = fmt.Sprintf("%s over all %d GPUs", l.Sharding, f.DPShard)
	case l.DPReplicate == 1:
		shape = fmt.Sprintf("%s over %d GPUs", l.Sharding, f.DPShard)
	default:
		shape = fmt.Sprintf("%s groups of %d GPUs × %d replicas", l.Sharding, f.DPShard, l.DPReplicate)
	}
	if l.EP > 1 {
		shape += fmt.Sprintf(", experts over ep %d", l.EP)
	}
	if l.Stages() > 1 {
		shape = fmt.Sprintf("a %d-stage pipeline, each stage %s", l.PP, shape)
	}
	if o := LayoutOptions(l); o != "-" {
		shape += " (" + o + ")"
	}
	batch := fmt.Sprintf("lbs %d", p.LBS)
	if p.GradAccum > 1 {
		batch += fmt.Sprintf(" × %d micro-steps", p.GradAccum)
	}
	batch += fmt.Sprintf(" (global batch %d sequences, %s tokens per step)", p.GlobalBatch(), Tokens(int64(p.GlobalBatch())*int64(seq)))
	line1 := fmt.Sprintf("best: %s, %s, %s: %.0f TPS per GPU, MFU %.1f%%, memory %.1f%% of %.2f GiB.",
		shape, acProse(p.AC), batch, b.Score.TPS, 100*b.Score.MFU, 100*b.Score.MemoryFraction, dev.MemoryGiB())
	var parts []string
	for _, t := range StepParts(b.Score.Breakdown) {
		if b.Score.StepTimeS > 0 && t.Seconds/b.Score.StepTimeS >= 0.005 { // parts that round to 0% are left out
			parts = append(parts, fmt.Sprintf("%s %.0f%%", t.Name, 100*t.Seconds/b.Score.StepTimeS))
		}
	}
	line2 := fmt.Sprintf("why: step %.3f s", b.Score.StepTimeS)
	if len(parts) > 0 {
		line2 += " = " + strings.Join(parts, " + ")
	}
	line2 += "; bottleneck " + b.Score.Bottleneck
	if len(rep.Plans) > 1 {
		next := rep.Plans[1]
		if gap := 1 - next.Score.TPS/math.Max(b.Score.TPS, 1e-300); gap < 0.0005 {
			line2 += fmt.Sprintf("; it ties with %s (lower memory breaks the tie)", PointName(next.Point))
		} else {
			line2 += fmt.Sprintf("; the runner-up (%s) is %.1f%% slower", PointName(next.Point), 100*gap)
		}
	}
	return [2]string{line1, line2 + "."}
}

// BatchNote is the remark plan makes when --global-batch is left free: the
// search then picks the batch too (lbs × data-parallel ranks, no
// accumulation), which changes the answer, so the note says what the best
// plan steps and how to hold a recipe's batch instead.
func BatchNote(rep *plan.Report, seq int) string {
	gb := rep.Best.Point.GlobalBatch()
	return fmt.Sprintf("the best plan steps %d sequences (%s tokens) per step; set --global-batch to hold the batch your recipe trains with.",
		gb, Tokens(int64(gb)*int64(seq)))
}

// Tokens is a token count for prose: exact below ten thousand, else in
// thousands (K), millions (M) or billions (B) to one decimal.
func Tokens(n int64) string {
	switch x := float64(n); {
	case n < 10_000:
		return fmt.Sprint(n)
	case x < 999_950:
		return fmt.Sprintf("%.1fK", x/1e3)
	case x < 999_950_000:
		return fmt.Sprintf("%.1fM", x/1e6)
	default:
		return fmt.Sprintf("%.1fB", x/1e9)
	}
}

// acProse names a checkpointing policy in a sentence.
func acProse(ac moe.AC) string {
	switch ac.Mode {
	case moe.ACNone:
		return "no activation checkpointing"
	case moe.ACSelective:
		return "per-op selective activation checkpointing"
	case moe.ACFull:
		return "full activation checkpointing"
	case moe.ACModules:
		return "Megatron-style recompute of " + strings.TrimPrefix(ac.String(), "modules:")
	case moe.ACMemoryBudget:
		return fmt.Sprintf("the compiler's memory-budget checkpointing at budget %g", ac.Budget)
	}
	return fmt.Sprintf("full checkpointing of every %d-th block", ac.Every)
}
