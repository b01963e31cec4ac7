package validate

import (
	"cmp"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteText prints the report as `moescope validate` does: the TPS table
// (per series, then the runs left out and the summaries) and the memory
// table with its summary.
func WriteText(w io.Writer, rep Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "validation of %s: %d run(s)\n\n", rep.Runs, rep.Count)
	b.WriteString("TPS, tokens/s per GPU: measured; predicted uncalibrated, and calibrated per series (one source file, model,\n" +
		"GPU, precision and framework version) on its smallest-GPU-count runs; err = predicted / measured − 1\n")
	writeTPS(&b, rep.TPS, rep.Shared)
	writePairs(&b, rep.Pairs)
	writeOrders(&b, rep.Orders)
	b.WriteString("\npeak memory per GPU, GiB: measured and predicted\n")
	writeMemory(&b, rep.Memory)
	writeScaleOut(&b, rep.ScaleOut)
	writeRouting(&b, rep.Routing)
	bd := rep.Bands
	fmt.Fprintf(&b, "\nuncalibrated 90%% bands of measured ÷ predicted: TPS [%.3f, %.3f] over %d %s runs of %d series, "+
		"leave-one-series-out coverage %.1f%%; memory [%.3f, %.3f] over %d runs, coverage %.1f%%\n",
		bd.TPS.Low, bd.TPS.High, bd.TPSRuns, bd.TPSGroup, bd.Series, 100*bd.TPSCoverage,
		bd.Memory.Low, bd.Memory.High, bd.MemoryRuns, 100*bd.MemoryCoverage)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeTPS prints the TPS table: a line per run, series after series; the
// runs left out (power-limited, then the shared table's rows); the
// summaries.
func writeTPS(b *strings.Builder, t TPSTable, shared *SharedTable) {
	fmt.Fprintf(b, "%-32s %-6s %5s %-7s %4s %-10s %9s %9s %8s %9s %8s\n", "run", "gpu", "gpus", "rep×shd", "lbs", "ac", "measured", "uncal", "err", "cal", "err")
	for _, s := range t.Series {
		for _, row := range s.Rows {
			b.WriteString(tpsLine(row) + "\n")
		}
	}
	for _, r := range t.PowerLimited {
		fmt.Fprintf(b, "skipped %s (%s %s, %d GPUs): needs the GPUs' power limit, which the source does not state (power_limited)\n", r.Label, r.Model, r.GPU, r.GPUs)
	}
	skippedNote := ""
	if shared != nil {
		for _, r := range shared.Skipped {
			fmt.Fprintf(b, "skipped %-5s %-20.20s %-18.18s %-6.6s %5s GPUs: needs %s\n", r.RunID, r.Framework, r.Model, r.GPU, r.GPUs, r.Needs)
		}
		skippedNote = fmt.Sprintf(" (%d rows of the shared table skipped)", len(shared.Skipped))
	}
	if s := t.Uncalibrated; s != nil {
		fmt.Fprintf(b, "uncalibrated |TPS error|: median %.1f%%, worst %.1f%% over %d runs%s\n", 100*s.Median, 100*s.Worst, s.Runs, skippedNote)
	} else {
		fmt.Fprintf(b, "uncalibrated |TPS error|: no run predicted%s\n", skippedNote)
	}
	if s := t.TensorParallel; s != nil {
		fmt.Fprintf(b, "uncalibrated |TPS error| of the tensor-parallel runs: median %.1f%%, worst %.1f%% over %d runs\n", 100*s.Median, 100*s.Worst, s.Runs)
	}
	for _, r := range t.ByRecipe {
		fmt.Fprintf(b, "uncalibrated |TPS error| of the %s runs: median %.1f%%, worst %.1f%% over %d runs\n", r.Recipe, 100*r.Median, 100*r.Worst, r.Runs)
	}
	if s := t.LowPrecision; s != nil {
		fmt.Fprintf(b, "uncalibrated |TPS error| of the low-precision runs together: median %.1f%%, worst %.1f%% over %d runs\n", 100*s.Median, 100*s.Worst, s.Runs)
	}
	if s := t.Calibrated; s != nil {
		fmt.Fprintf(b, "calibrated on each series' small-scale runs, |TPS error| of its larger runs: median %.1f%%, worst %.1f%% over %d runs\n",
			100*s.Median, 100*s.Worst, s.Runs)
	}
}

// writePairs prints the A/B pairs: measured and predicted TPS ratios of
// runs that differ in settings of the stack only.
func writePairs(b *strings.Builder, t PairTable) {
	if len(t.Pairs) == 0 {
		return
	}
	b.WriteString("\nA/B pairs: runs of one source that differ only in settings of the stack; TPS of B ÷ A, measured and predicted\n" +
		"(uncalibrated: a constant error of the model cancels); err = predicted ÷ measured − 1\n")
	fmt.Fprintf(b, "%-28s %-28s %-50s %8s %9s %7s\n", "A", "B", "setting", "measured", "predicted", "err")
	for _, p := range t.Pairs {
		fmt.Fprintf(b, "%-28s %-28s %-50s %8.3f %9.3f %+6.1f%%\n", p.A, p.B, p.Setting, p.Measured, p.Predicted, 100*p.Error)
	}
	fmt.Fprintf(b, "A/B pairs |ratio error|: median %.1f%%, worst %.1f%% over %d pairs; %d within 10%%\n",
		100*t.Error.Median, 100*t.Error.Worst, t.Error.Runs, t.Within10)
}

// writeOrders prints the tuning sweeps' rank correlations.
func writeOrders(b *strings.Builder, orders []Order) {
	if len(orders) == 0 {
		return
	}
	fmt.Fprintf(b, "\norder of tuning sweeps (≥ %d runs of one source, model, GPU count and sequence length differing in settings):\n"+
		"Spearman's ρ between measured and uncalibrated predicted TPS (1: the same order)\n", minOrderRuns)
	for _, o := range orders {
		fmt.Fprintf(b, "%-60s %3d runs  ρ %+.3f\n", o.Series, len(o.Runs), o.Spearman)
	}
}

// tpsLine is a run's line of the TPS table.
func tpsLine(row TPSRow) string {
	line := fmt.Sprintf("%-32s %-6s %5d %-7s %4d %-10s %9.0f %9.0f %+7.1f%%", row.Name, row.GPU, row.GPUs,
		row.Layout, row.LBS, row.AC, row.Measured, row.Uncalibrated, 100*row.UncalibratedError)
	if row.Calibrated != nil {
		role := ""
		if row.Fit {
			role = " (fit)"
		}
		line += fmt.Sprintf(" %9.0f %+7.1f%%%s", *row.Calibrated, 100**row.CalibratedError, role)
	}
	if row.FrameworkNotModelled {
		line += " [framework difference not modelled: " + cmp.Or(row.Framework, "framework not stated") + "]"
	}
	return line
}

// writeMemory prints the memory table, its legend and its summary.
func writeMemory(b *strings.Builder, t MemoryTable) {
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\tmodel\tgpu\tgpus\tlayout\tac\tlbs\tseq\tmeasured GiB\tpredicted GiB\terror\tfits\t")
	for _, row := range t.Rows {
		fmt.Fprintln(tw, memoryLine(row)+"\t")
	}
	tw.Flush() // into a strings.Builder: cannot fail
	b.WriteString("measured: r = peak reserved, a = peak allocated (compared with the predicted peak allocated); * = torch.compile; fits = moescope's verdict (every run ran); † = a framework difference not modelled (the run's unmodelled field); ‡ = settings the source states that cannot have run (the run's inconsistent field): its verdict is not judged\n")
	if s := t.Error; s != nil {
		fmt.Fprintf(b, "memory |error|: median %.1f%%, worst %.1f%% over %d runs\n", 100*s.Median, 100*s.Worst, s.Runs)
	} else {
		b.WriteString("memory |error|: no run of a priced recipe with a measured peak\n")
	}
	fmt.Fprintf(b, "predicted not to fit: %d of %d runs that ran", t.NotFit, t.Ran)
	for _, row := range t.Rows {
		if row.Inconsistent != "" {
			fmt.Fprintf(b, "; not judged: %s (%s)", row.Name, row.Inconsistent)
		}
	}
	b.WriteString("\n")
}

// memoryLine is a run's line of the memory table, its cells tab-separated.
func memoryLine(row MemoryRow) string {
	kind := row.Kind[:1] // r or a
	measured, errText := "-", "-"
	if row.Measured != nil {
		measured = fmt.Sprintf("%.2f %s", *row.Measured, kind)
	}
	switch {
	case row.Error != nil:
		errText = fmt.Sprintf("%+.1f%%", 100**row.Error)
	case row.PrecisionNotModelled:
		errText = "prec?" // a recipe the memory model does not price
	}
	if row.Unmodelled != "" {
		errText += " †"
	}
	ac := row.AC
	if row.Compile {
		ac += "*"
	}
	verdict := "yes"
	if !row.Fits {
		verdict = "NO"
	}
	if row.Inconsistent != "" {
		verdict += " ‡"
	}
	return strings.Join([]string{row.Name, row.Model, row.GPU, fmt.Sprint(row.GPUs), row.Layout, ac, fmt.Sprint(row.LBS), fmt.Sprint(row.Seq),
		measured, fmt.Sprintf("%.2f %s", row.Predicted, kind), errText, verdict}, "\t")
}
