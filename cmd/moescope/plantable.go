package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/plan"
)

// With pp (tp) searched, the stage table says which pp (tp) each stage's
// best plan uses, so it shows at which scale a pipeline (tensor
// parallelism) enters the lead; with both, both columns.
func planWriteTable(w io.Writer, title string, rep *plan.Report, top int, dev hw.Device, ppSearched, tpSearched bool) {
	mode := "hierarchical search"
	if rep.Exhaustive {
		mode = "exhaustive search"
	}
	fmt.Fprintf(w, "moescope plan: %s\n%s, %d candidates simulated\n\n", title, mode, rep.Simulated)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	ppCol := map[bool]string{true: "best pp\t"}[ppSearched] + map[bool]string{true: "best tp\t"}[tpSearched]
	fmt.Fprintln(tw, "stage\tGPUs\tcandidates\tpruned\tsimulated\tcarried\tbest TPS\tscaling eff.\tgrew\t"+ppCol)
	for i, st := range rep.Stages {
		grew := st.Grew
		if grew == "" {
			grew = "-"
		}
		carried := "-"
		if i < len(rep.Stages)-1 {
			carried = fmt.Sprint(len(st.Survivors))
		}
		pp := ""
		if ppSearched && len(st.Survivors) > 0 {
			pp = fmt.Sprintf("%d\t", st.Survivors[0].Point.Layout.Stages())
		}
		if tpSearched && len(st.Survivors) > 0 {
			pp += fmt.Sprintf("%d\t", st.Survivors[0].Point.Layout.TPDegree())
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%s\t%.0f\t%.1f%%\t%s\t%s\n", i+1, st.GPUs, st.Candidates, st.Pruned, st.Simulated, carried, st.BestTPS, 100*st.ScalingEfficiency, grew, pp)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rank\tdp_shard\tdp_rep\tep\tsharding\toptions\tac\tlbs\taccum\tTPS\tMFU\tmemory\tstep s\tbottleneck\t")
	for i, r := range rep.Plans {
		if i == top {
			break
		}
		l := r.Point.Layout
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s\t%s\t%s\t%d\t%d\t%s\t%.1f%%\t%.1f%%\t%.3f\t%s\t\n", i+1, l.DPShard, l.DPReplicate, l.EP,
			l.Sharding, report.LayoutOptions(l), r.Point.AC, r.Point.LBS, r.Point.GradAccum, tpsText(r.Score), 100*r.Score.MFU,
			100*r.Score.MemoryFraction, r.Score.StepTimeS, r.Score.Bottleneck)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, line := range planExplain(rep, dev) {
		fmt.Fprintln(w, line)
	}
	if ppSearched {
		fmt.Fprintln(w, planPipelineVerdict(rep))
	}
}

// planPipelineVerdict says whether pipeline parallelism wins: the best
// plan with pp > 1 and the best without, and how far apart they are.
func planPipelineVerdict(rep *plan.Report) string {
	var pipe, flat *plan.Result
	for i := range rep.Plans {
		r := &rep.Plans[i]
		if r.Point.Layout.Stages() > 1 && pipe == nil {
			pipe = r
		}
		if r.Point.Layout.Stages() == 1 && flat == nil {
			flat = r
		}
	}
	switch {
	case pipe == nil:
		return "pipeline: no pipeline layout is among the plans at the target scale."
	case flat == nil:
		return fmt.Sprintf("pipeline: only pipelines are among the plans; the best is %s.", report.PointName(pipe.Point))
	case pipe.Score.TPS > flat.Score.TPS:
		return fmt.Sprintf("pipeline: PP wins: %s is %.1f%% faster than the best without a pipeline (%s).",
			report.PointName(pipe.Point), 100*(pipe.Score.TPS/flat.Score.TPS-1), report.PointName(flat.Point))
	}
	return fmt.Sprintf("pipeline: PP does not win: the best pipeline (%s) is %.1f%% slower than the best plan.",
		report.PointName(pipe.Point), 100*(1-pipe.Score.TPS/flat.Score.TPS))
}

// planExplain is the two-line explanation of the best plan: what it is and
// what it predicts, then where its step time goes and what it beat.
func planExplain(rep *plan.Report, dev hw.Device) [2]string {
	b := rep.Best
	l, p := b.Point.Layout, b.Point
	var shape string
	switch {
	case l.DPShard == 1:
		shape = fmt.Sprintf("pure data parallelism over %d replicas", l.DPReplicate)
	case l.DPReplicate == 1 && l.TPDegree() == 1 && l.Stages() == 1:
		shape = fmt.Sprintf("%s over all %d GPUs", l.Sharding, l.DPShard)
	case l.DPReplicate == 1:
		shape = fmt.Sprintf("%s over %d GPUs", l.Sharding, l.DPShard)
	default:
		shape = fmt.Sprintf("%s groups of %d GPUs × %d replicas", l.Sharding, l.DPShard, l.DPReplicate)
	}
	if l.EP > 1 {
		shape += fmt.Sprintf(", experts over ep %d", l.EP)
	}
	if l.Stages() > 1 {
		shape = fmt.Sprintf("a %d-stage pipeline, each stage %s", l.PP, shape)
	}
	if o := report.LayoutOptions(l); o != "-" {
		shape += " (" + o + ")"
	}
	batch := fmt.Sprintf("lbs %d", p.LBS)
	if p.GradAccum > 1 {
		batch += fmt.Sprintf(" × %d micro-steps", p.GradAccum)
	}
	line1 := fmt.Sprintf("best: %s, %s, %s: %.0f TPS per GPU, MFU %.1f%%, memory %.1f%% of %.2f GiB.",
		shape, planACProse(p.AC), batch, b.Score.TPS, 100*b.Score.MFU, 100*b.Score.MemoryFraction, dev.MemoryGiB())
	var parts []string
	for _, t := range report.StepParts(b.Score.Breakdown) {
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
			line2 += fmt.Sprintf("; it ties with %s (lower memory breaks the tie)", report.PointName(next.Point))
		} else {
			line2 += fmt.Sprintf("; the runner-up (%s) is %.1f%% slower", report.PointName(next.Point), 100*gap)
		}
	}
	return [2]string{line1, line2 + "."}
}

// planACProse names a checkpointing policy in a sentence.
func planACProse(ac moe.AC) string {
	switch ac.Mode {
	case moe.ACNone:
		return "no activation checkpointing"
	case moe.ACSelective:
		return "per-op selective activation checkpointing"
	case moe.ACFull:
		return "full activation checkpointing"
	case moe.ACModules:
		return "Megatron-style recompute of " + strings.TrimPrefix(ac.String(), "modules:")
	}
	return fmt.Sprintf("full checkpointing of every %d-th block", ac.Every)
}

// tpsText is a plan's TPS for the table, with "± x%" (the interval's larger
// half-width) under a calibration.
func tpsText(s plan.Score) string {
	if iv := s.TPSInterval; iv != nil {
		return fmt.Sprintf("%.0f ±%.0f%%", s.TPS, 100*math.Max(iv[1]/s.TPS-1, 1-iv[0]/s.TPS))
	}
	return fmt.Sprintf("%.0f", s.TPS)
}
