package report

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/parallel/hw"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// plotScaling draws the whole job's tokens/s at each stage's best plan
// against GPUs, on log-log axes beside ideal scaling from stage 1 (its
// per-GPU TPS times the GPU count), each point labelled with its layout
// and scaling efficiency. Per-GPU TPS alone is a flat line that hides
// both the scale and the gap.
func plotScaling(d *Data) (*plot.Plot, error) {
	// The y title is short on purpose: gonum centres its box at the
	// arithmetic middle of the range, near the top of a log axis, and pads
	// the plot for a long one.
	p := newFigure(fmt.Sprintf("%s on %s: whole-job tokens/s of each stage's best plan (log-log)", d.Model, d.GPU),
		"GPUs (log scale)", "million tokens/s")
	st := d.Search.Stages
	if len(st) == 0 || st[0].BestTPS <= 0 {
		return p, nil
	}
	got, ideal := make(plotter.XYs, len(st)), make(plotter.XYs, len(st))
	labels := make([]string, len(st))
	var xt plot.ConstantTicks
	for i, s := range st {
		x := float64(s.GPUs)
		got[i] = plotter.XY{X: x, Y: s.BestTPS * x / 1e6}
		ideal[i] = plotter.XY{X: x, Y: st[0].BestTPS * x / 1e6}
		labels[i] = fmt.Sprintf("%d GPUs: %.0f per GPU, eff. %.1f%%", s.GPUs, s.BestTPS, 100*s.ScalingEfficiency)
		if len(s.Survivors) > 0 {
			b := s.Survivors[0].Point
			labels[i] += fmt.Sprintf("\n%s\nac %s, lbs %d", layoutShort(b.Layout), b.AC, b.LBS)
		}
		xt = append(xt, plot.Tick{Value: x, Label: fmt.Sprint(s.GPUs)})
	}
	if err := plotutil.AddLinePoints(p, "modelled best plan of each stage", got); err != nil {
		return nil, err
	}
	// Ideal scaling is drawn over the model, dashed, so both show where
	// they coincide.
	line, err := plotter.NewLine(ideal)
	if err != nil {
		return nil, err
	}
	line.Dashes, line.Color, line.Width = []vg.Length{vg.Points(6), vg.Points(4)}, plotutil.Color(2), vg.Points(1.5)
	p.Add(line)
	p.Legend.Add(fmt.Sprintf("ideal scaling from stage 1 (%.0f tokens/s per GPU × GPUs)", st[0].BestTPS), line)
	// Below and right of each point: the curve rises to the right, so the
	// text stays clear of it and of the next point's label; the axis
	// ranges below leave room for it.
	l, err := newLabels(got, labels, vg.Point{X: vg.Points(6), Y: -vg.Points(10)}, draw.XLeft, draw.YTop)
	if err != nil {
		return nil, err
	}
	p.Add(unpadded{l})
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, xt
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, logTicks125{}
	lo, hi := math.Min(got[0].Y, ideal[0].Y), math.Max(got[len(got)-1].Y, ideal[len(ideal)-1].Y)
	// Room below for the last point's three-line label, and on the right
	// for the labels' width (one more factor of the x range).
	p.Y.Min, p.Y.Max = lo/4, hi*1.5
	p.X.Min, p.X.Max = got[0].X/1.5, got[len(got)-1].X*math.Pow(got[len(got)-1].X/got[0].X, 0.55)
	return p, nil
}

// logTicks125 labels a log axis at 1, 2 and 5 times powers of ten, which
// stays readable over one or two decades where powers of ten alone give
// one or two labels.
type logTicks125 struct{}

func (logTicks125) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			if v := m * math.Pow(10, e); v >= lo && v <= hi {
				ticks = append(ticks, plot.Tick{Value: v, Label: fmt.Sprintf("%g", v)})
			}
		}
	}
	return ticks
}

// plotBreakdown draws the best plan's step as horizontal bars, one per
// part of the critical path, each labelled with its seconds and share, so
// that parts too short to see still read.
func plotBreakdown(d *Data) (*plot.Plot, error) {
	b := d.Search.Best
	p := newFigure(fmt.Sprintf("%s on %d × %s: step time of the best plan (%.3f s)", d.Model, b.Point.Layout.GPUs, d.GPU, b.Score.StepTimeS),
		"seconds on the critical path of the slowest rank", "")
	parts := StepParts(b.Score.Breakdown)
	vals, names := make(plotter.Values, len(parts)), make([]string, len(parts))
	xy, labels := make(plotter.XYs, len(parts)), make([]string, len(parts))
	top := 0.0
	// Bars from the top in print order: NominalY counts up from the bottom.
	for i, t := range parts {
		j := len(parts) - 1 - i
		vals[j], names[j] = t.Seconds, t.Name
		xy[j] = plotter.XY{X: t.Seconds, Y: float64(j)}
		labels[j] = fmt.Sprintf("%.4f s (%.1f%%)", t.Seconds, 100*t.Seconds/math.Max(b.Score.StepTimeS, 1e-300))
		top = math.Max(top, t.Seconds)
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(18))
	if err != nil {
		return nil, err
	}
	bars.Horizontal, bars.Color = true, plotutil.Color(0)
	p.Add(bars)
	if err := addText(p, xy, labels, vg.Point{X: vg.Points(5)}, draw.XLeft, draw.YCenter); err != nil {
		return nil, err
	}
	p.NominalY(names...)
	p.Y.Tick.Label.Font.Size = 12
	p.X.Min, p.X.Max = 0, 1.3*math.Max(top, 1e-9)
	return p, nil
}

// plotMemoryTimeline draws the best plan's allocated bytes after each
// event of its step timeline (memory's order, the order the schedule
// emits), with the modelled peak reserved, the target and the device
// capacity, and the step's phases named along the top.
func plotMemoryTimeline(d *Data) (*plot.Plot, error) {
	evs := d.Memory.Events
	p := newFigure(fmt.Sprintf("%s on %d × %s: memory timeline of the best plan's step (one GPU)", d.Model, d.Search.Best.Point.Layout.GPUs, d.GPU),
		"allocation event (step order: forward, backward, optimizer)", "GiB")
	if len(evs) == 0 {
		return p, nil
	}
	live := make(plotter.XYs, len(evs))
	var cur int64
	for i, e := range evs {
		cur += e.Delta()
		live[i] = plotter.XY{X: float64(i), Y: float64(cur) / hw.GiB}
	}
	line, err := plotter.NewLine(live)
	if err != nil {
		return nil, err
	}
	line.Color, line.Width = plotutil.Color(0), vg.Points(1.5)
	p.Add(line)
	p.Legend.Add("allocated (live tensors)", line)
	pk := d.Memory.Peak
	n := float64(len(evs) - 1)
	for _, lv := range []struct {
		y     float64
		text  string
		where int
	}{
		{float64(pk.Reserved) / hw.GiB, fmt.Sprintf("peak reserved %.1f GiB (allocator model)", float64(pk.Reserved)/hw.GiB), belowRight},
		{d.Target * d.DeviceGiB, fmt.Sprintf("memory target %.0f%% = %.1f GiB", 100*d.Target, d.Target*d.DeviceGiB), above},
		{d.DeviceGiB, fmt.Sprintf("device %.1f GiB", d.DeviceGiB), above},
	} {
		if err := addLevel(p, 0, n, lv.y, lv.text, lv.where); err != nil {
			return nil, err
		}
	}
	if pk.Index >= 0 {
		if err := addMarked(p, pk.Index, float64(pk.Allocated)/hw.GiB, fmt.Sprintf("peak allocated %.1f GiB", float64(pk.Allocated)/hw.GiB), belowRight); err != nil {
			return nil, err
		}
	}
	p.X.Min, p.X.Max = 0, n
	p.Y.Min, p.Y.Max = 0, 1.12*d.DeviceGiB
	if err := addPhaseMarks(p, evs); err != nil {
		return nil, err
	}
	return p, nil
}

// addPhaseMarks draws a thin vertical line where the step changes phase
// (or micro-step) and names each phase near the top, skipping names of
// phases too short to hold one.
func addPhaseMarks(p *plot.Plot, evs []memory.Event) error {
	var xy plotter.XYs
	var names []string
	start := 0
	flush := func(end int) error {
		if evs[start].Phase == memory.Setup {
			return nil
		}
		if start > 0 {
			v, err := plotter.NewLine(plotter.XYs{{X: float64(start), Y: 0}, {X: float64(start), Y: p.Y.Max}})
			if err != nil {
				return err
			}
			v.Color, v.Width = plotutil.Color(7), vg.Points(0.5)
			p.Add(v)
		}
		if float64(end-start) >= 0.07*float64(len(evs)) {
			name := string(evs[start].Phase)
			if evs[start].Micro > 0 {
				name += fmt.Sprintf(" %d", evs[start].Micro)
			}
			xy = append(xy, plotter.XY{X: float64(start+end) / 2, Y: 0})
			names = append(names, name)
		}
		return nil
	}
	for i := 1; i <= len(evs); i++ {
		if i == len(evs) || evs[i].Phase != evs[start].Phase || evs[i].Micro != evs[start].Micro {
			if err := flush(i); err != nil {
				return err
			}
			start = i
		}
	}
	if len(xy) == 0 {
		return nil
	}
	return addText(p, xy, names, vg.Point{Y: vg.Points(4)}, draw.XCenter, draw.YBottom)
}
