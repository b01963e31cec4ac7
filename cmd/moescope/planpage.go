package main

import (
	"io"
	"runtime/debug"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/plan"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// writePlanReport writes the page `moescope plan --report FILE.html` asks
// for to w: d's pictures and tables, with plan's settings, its explanation
// of the best plan (as the table prints it) and notes, led by the table's
// --global-batch note when the batch was left free.
func writePlanReport(w io.Writer, title string, a *planArgs, rep *plan.Report, d *report.Data, dev hw.Device, cal *cost.Calibration, notes []string) error {
	p := report.Page{Title: title, GPUs: a.gpus, Seq: a.seq, GlobalBatch: a.globalBatch, Top: a.top,
		Calibration: cal, CalibrationFile: a.calibration, Explain: report.Explain(rep, dev, a.seq), Notes: notes}
	if a.globalBatch == 0 {
		p.Notes = append([]string{report.BatchNote(rep, a.seq)}, notes...)
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		p.Version = versionText(info)
	}
	return report.Write(w, d, p)
}
