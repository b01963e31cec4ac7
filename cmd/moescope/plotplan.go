package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/parallel/plan"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// planPlotNames are the pictures `moescope plan --plot DIR` writes, each as
// .png and .svg.
var planPlotNames = []string{"plan_lbs_tps", "plan_lbs_memory", "plan_scaling", "plan_breakdown"}

// planPlotPaths lists the files planWritePlots writes into dir.
func planPlotPaths(dir string) []string {
	var out []string
	for _, n := range planPlotNames {
		for _, ext := range []string{".png", ".svg"} {
			out = append(out, filepath.Join(dir, n+ext))
		}
	}
	return out
}

// planWritePlots renders the search's pictures into dir: TPS and memory
// against local batch for the best stage-1 family of each checkpointing
// policy, best per-GPU TPS and scaling efficiency against GPU count, and
// the best plan's step-time breakdown. Existing files are refused unless
// force; every file is written atomically.
func planWritePlots(stderr io.Writer, dir string, force bool, rep *plan.Report, model, gpu string, target float64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	if !force {
		for _, p := range planPlotPaths(dir) {
			if _, err := os.Lstat(p); err == nil {
				return fmt.Errorf("%s: %w", p, fileio.ErrExists)
			}
		}
	}
	plots := map[string]*plot.Plot{}
	var err error
	if plots["plan_lbs_tps"], plots["plan_lbs_memory"], err = planPlotSweeps(rep, model, gpu, target); err != nil {
		return err
	}
	if plots["plan_scaling"], err = planPlotScaling(rep, model, gpu); err != nil {
		return err
	}
	if plots["plan_breakdown"], err = planPlotBreakdown(rep, model, gpu); err != nil {
		return err
	}
	for _, n := range planPlotNames {
		for _, ext := range []string{"png", "svg"} {
			wt, err := plots[n].WriterTo(16*vg.Centimeter, 10*vg.Centimeter, ext)
			if err != nil {
				return fmt.Errorf("--plot %s.%s: %w", n, ext, err)
			}
			var buf bytes.Buffer
			if _, err := wt.WriteTo(&buf); err != nil {
				return fmt.Errorf("--plot %s.%s: %w", n, ext, err)
			}
			path := filepath.Join(dir, n+"."+ext)
			if err := fileio.WriteFileAtomic(path, force, func(w io.Writer) error {
				_, err := w.Write(buf.Bytes())
				return err
			}); err != nil {
				return err
			}
			fmt.Fprintf(stderr, "wrote %s\n", path)
		}
	}
	return nil
}

func planPlotSweeps(rep *plan.Report, model, gpu string, target float64) (tps, mem *plot.Plot, err error) {
	tps, mem = plot.New(), plot.New()
	gpus := 0
	if len(rep.Stages) > 0 {
		gpus = rep.Stages[0].GPUs
	}
	tps.Title.Text = fmt.Sprintf("%s on %d × %s: TPS per GPU against local batch", model, gpus, gpu)
	tps.X.Label.Text, tps.Y.Label.Text = "local batch (sequences)", "tokens/s per GPU"
	mem.Title.Text = fmt.Sprintf("%s on %d × %s: memory against local batch", model, gpus, gpu)
	mem.X.Label.Text, mem.Y.Label.Text = "local batch (sequences)", "peak reserved / device memory"
	var tpsArgs, memArgs []any
	for _, sw := range rep.Sweeps {
		t, m := make(plotter.XYs, len(sw.Points)), make(plotter.XYs, len(sw.Points))
		for i, r := range sw.Points {
			t[i] = plotter.XY{X: float64(r.Point.LBS), Y: r.Score.TPS}
			m[i] = plotter.XY{X: float64(r.Point.LBS), Y: r.Score.MemoryFraction}
		}
		label := sw.AC.String()
		if len(sw.Points) > 0 {
			l := sw.Points[0].Point.Layout
			label += fmt.Sprintf(" (%s %d×%d ep %d %s)", l.Sharding, l.DPShard, l.DPReplicate, l.EP, planOptions(l))
		}
		tpsArgs = append(tpsArgs, label, t)
		memArgs = append(memArgs, sw.AC.String(), m)
	}
	if len(tpsArgs) == 0 {
		return tps, mem, nil // an exhaustive search has no stage-1 sweeps
	}
	if err := plotutil.AddLinePoints(tps, tpsArgs...); err != nil {
		return nil, nil, err
	}
	if err := plotutil.AddLinePoints(mem, memArgs...); err != nil {
		return nil, nil, err
	}
	// The memory target, across the swept range.
	maxLBS := 1.0
	for _, sw := range rep.Sweeps {
		for _, r := range sw.Points {
			maxLBS = max(maxLBS, float64(r.Point.LBS))
		}
	}
	line, err := plotter.NewLine(plotter.XYs{{X: 1, Y: target}, {X: maxLBS, Y: target}})
	if err != nil {
		return nil, nil, err
	}
	line.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
	mem.Add(line)
	mem.Legend.Add(fmt.Sprintf("memory target %.2f", target), line)
	tps.Legend.Top, mem.Legend.Top, mem.Legend.Left = false, true, true
	tps.Y.Min, mem.Y.Min = 0, 0
	return tps, mem, nil
}

func planPlotScaling(rep *plan.Report, model, gpu string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s on %s: best plan per stage", model, gpu)
	p.X.Label.Text, p.Y.Label.Text = "GPUs", "tokens/s per GPU"
	xy := make(plotter.XYs, len(rep.Stages))
	labels := make([]string, len(rep.Stages))
	var ticks plot.ConstantTicks
	for i, st := range rep.Stages {
		xy[i] = plotter.XY{X: float64(st.GPUs), Y: st.BestTPS}
		labels[i] = fmt.Sprintf("%.0f%%", 100*st.ScalingEfficiency)
		ticks = append(ticks, plot.Tick{Value: float64(st.GPUs), Label: fmt.Sprint(st.GPUs)})
	}
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, ticks
	if err := plotutil.AddLinePoints(p, "best TPS per GPU (label: scaling efficiency vs stage 1)", xy); err != nil {
		return nil, err
	}
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: xy, Labels: labels})
	if err != nil {
		return nil, err
	}
	p.Add(l)
	p.Y.Min = 0
	p.Legend.Top = false
	return p, nil
}

func planPlotBreakdown(rep *plan.Report, model, gpu string) (*plot.Plot, error) {
	p := plot.New()
	b := rep.Best
	p.Title.Text = fmt.Sprintf("%s on %d × %s: step time of the best plan (%.3f s)", model, b.Point.Layout.GPUs, gpu, b.Score.StepTimeS)
	p.Y.Label.Text = "seconds on the critical path"
	var vals plotter.Values
	var names []string
	for _, t := range stepParts(b.Score.Breakdown) {
		vals = append(vals, t.Seconds)
		names = append(names, t.Name)
	}
	if len(vals) == 0 {
		return p, nil
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(20))
	if err != nil {
		return nil, err
	}
	bars.Color = plotutil.Color(0)
	p.Add(bars)
	p.NominalX(names...)
	p.Y.Min = 0
	return p, nil
}
