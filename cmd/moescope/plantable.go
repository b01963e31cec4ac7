package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/plan"
)

// planWriteTable prints plan's table: the stages, a's top plans and the
// best explained, with a note suggesting --global-batch when a left it
// free. With pp (tp) searched, the stage table says which pp (tp) each
// stage's best plan uses, so it shows at which scale a pipeline (tensor
// parallelism) enters the lead; with both, both columns.
func planWriteTable(w io.Writer, title string, rep *plan.Report, a *planArgs, dev hw.Device) {
	above1 := func(d int) bool { return d > 1 }
	top, ppSearched, tpSearched := a.top, slices.ContainsFunc(a.pps, above1), slices.ContainsFunc(a.tps, above1)
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
		rank := fmt.Sprint(i + 1)
		if r.Score.Indistinguishable {
			rank += "≈"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%d\t%d\t%s\t%.1f%%\t%.1f%%\t%.3f\t%s\t\n", rank, l.DPShard, l.DPReplicate, l.EP,
			l.Sharding, report.LayoutOptions(l), r.Point.AC, r.Point.LBS, r.Point.GradAccum, tpsText(r.Score), 100*r.Score.MFU,
			100*r.Score.MemoryFraction, r.Score.StepTimeS, r.Score.Bottleneck)
	}
	tw.Flush()
	if iv := rep.Best.Score.TPSInterval; iv != nil {
		fmt.Fprintf(w, "TPS ± its 90%% interval (%s); ≈: the interval reaches the best's (%.0f–%.0f), the model cannot tell the plan from the best\n",
			intervalSource(rep), iv[0], iv[1])
	}
	fmt.Fprintln(w)
	for _, line := range report.Explain(rep, dev, a.seq) {
		fmt.Fprintln(w, line)
	}
	if a.globalBatch == 0 {
		fmt.Fprintln(w, "note: "+report.BatchNote(rep, a.seq))
	}
	if rep.CPNote != "" {
		fmt.Fprintln(w, "note: "+rep.CPNote)
	}
	if len(rep.Knobs) > 0 {
		fmt.Fprintln(w)
		plan.WriteKnobs(w, rep.Knobs)
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

// intervalSource says where the plans' intervals come from.
func intervalSource(rep *plan.Report) string {
	if rep.Calibrated {
		return "the calibration's fit, or its uncalibrated band where it carries none"
	}
	return "uncalibrated: the published runs' errors"
}

// tpsText is a plan's TPS for the table, with "± x%" (the interval's larger
// half-width) when it has one.
func tpsText(s plan.Score) string {
	if iv := s.TPSInterval; iv != nil {
		return fmt.Sprintf("%.0f ±%.0f%%", s.TPS, 100*math.Max(iv[1]/s.TPS-1, 1-iv[0]/s.TPS))
	}
	return fmt.Sprintf("%.0f", s.TPS)
}
