package report

import (
	"fmt"
	"runtime"

	"github.com/moescope/moescope/memory/verdict"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel/plan"
	"golang.org/x/sync/errgroup"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// TargetSweeps evaluates, at the target scale, every local batch within
// the memory target for one layout per checkpointing policy: the best plan
// of that policy, or the best plan's layout under it when the search
// carried no family of that policy to the end. The search's own sweeps are
// at stage 1 (one host), where the answer's local batch is not: FSDP over
// more GPUs shards more state, so more sequences fit. Local batches run
// from 1 to maxLBS: under pp only those the schedule accepts; with a
// globalBatch (sequences, 0: free) only those that divide it over the
// data-parallel ranks, each with the micro-steps that make it up. acs are
// the policies searched (nil: the planner's default, plan.DefaultACs).
func TargetSweeps(ev plan.Evaluator, rep *plan.Report, target float64, maxLBS, globalBatch int, acs []moe.AC) ([]plan.Sweep, error) {
	var sweeps []plan.Sweep
	if acs == nil {
		acs = plan.DefaultACs()
	}
	for _, ac := range acs {
		layout := rep.Best.Point.Layout
		for _, r := range rep.Plans { // best first
			if r.Point.AC == ac {
				layout = r.Point.Layout
				break
			}
		}
		var points []plan.Point
		for lbs := 1; lbs <= maxLBS; lbs++ {
			if _, err := layout.Microbatches(lbs); err != nil {
				// A pipeline runs only whole micro-batches its schedule
				// accepts (DualPipeV: at least 2·pp of them); the
				// evaluator refuses the others.
				continue
			}
			accum := 1
			if globalBatch > 0 {
				if globalBatch%(lbs*layout.DP()) != 0 {
					continue
				}
				accum = globalBatch / (lbs * layout.DP())
			}
			p := plan.Point{Layout: layout, AC: ac, LBS: lbs, GradAccum: accum}
			m, err := ev.MemoryFraction(p)
			if err != nil {
				return nil, err
			}
			if !verdict.WithinTarget(m, target) {
				break // memory does not decrease with lbs
			}
			points = append(points, p)
		}
		results := make([]plan.Result, len(points))
		var g errgroup.Group
		g.SetLimit(runtime.GOMAXPROCS(0))
		for i, p := range points {
			g.Go(func() error {
				s, err := ev.Evaluate(p)
				results[i] = plan.Result{Point: p, Score: s}
				return err
			})
		}
		if err := g.Wait(); err != nil {
			return nil, err
		}
		sw := plan.Sweep{AC: ac}
		for _, r := range results {
			if !r.Score.DoesNotFit {
				sw.Points = append(sw.Points, r)
			}
		}
		if len(sw.Points) > 0 {
			sweeps = append(sweeps, sw)
		}
	}
	return sweeps, nil
}

// plotSweeps draws TPS and memory against local batch for the sweeps,
// marking the best plan, with the memory target as a labelled line.
func plotSweeps(d *Data) (tps, mem *plot.Plot, err error) {
	gpus := d.Search.Best.Point.Layout.GPUs
	tps = newFigure(fmt.Sprintf("%s on %d × %s: TPS per GPU against local batch", d.Model, gpus, d.GPU),
		"local batch (sequences per GPU per micro-step)", "throughput (tokens/s per GPU)")
	mem = newFigure(fmt.Sprintf("%s on %d × %s: memory against local batch", d.Model, gpus, d.GPU),
		"local batch (sequences per GPU per micro-step)", fmt.Sprintf("peak reserved memory (%% of %.1f GiB)", d.DeviceGiB))
	var tpsArgs, memArgs []any
	maxLBS, maxTPS := 1.0, 0.0
	for _, sw := range d.Sweeps {
		t, m := make(plotter.XYs, len(sw.Points)), make(plotter.XYs, len(sw.Points))
		for i, r := range sw.Points {
			t[i] = plotter.XY{X: float64(r.Point.LBS), Y: r.Score.TPS}
			m[i] = plotter.XY{X: float64(r.Point.LBS), Y: 100 * r.Score.MemoryFraction}
			maxLBS, maxTPS = max(maxLBS, float64(r.Point.LBS)), max(maxTPS, r.Score.TPS)
		}
		label := fmt.Sprintf("ac %s, %s", sw.AC, layoutShort(sw.Points[0].Point.Layout))
		tpsArgs, memArgs = append(tpsArgs, label, t), append(memArgs, label, m)
	}
	if len(tpsArgs) > 0 {
		if err := plotutil.AddLinePoints(tps, tpsArgs...); err != nil {
			return nil, nil, err
		}
		if err := plotutil.AddLinePoints(mem, memArgs...); err != nil {
			return nil, nil, err
		}
	}
	b := d.Search.Best
	if err := addMarked(tps, b.Point.LBS, b.Score.TPS, fmt.Sprintf("best: lbs %d, %.0f tokens/s", b.Point.LBS, b.Score.TPS), above); err != nil {
		return nil, nil, err
	}
	if err := addMarked(mem, b.Point.LBS, 100*b.Score.MemoryFraction, fmt.Sprintf("best: lbs %d, %.1f%%", b.Point.LBS, 100*b.Score.MemoryFraction), belowRight); err != nil {
		return nil, nil, err
	}
	if err := addLevel(mem, 1, max(maxLBS, float64(b.Point.LBS)), 100*d.Target, fmt.Sprintf("memory target %.0f%%", 100*d.Target), above); err != nil {
		return nil, nil, err
	}
	tps.Y.Min, tps.Y.Max = 0, 1.1*max(maxTPS, b.Score.TPS)
	mem.Y.Min, mem.Y.Max = 0, 105
	tps.X.Min, mem.X.Min = 0, 0
	return tps, mem, nil
}

// Where a label sits relative to its point.
const (
	belowRight = iota // curves rise to the right: below-right is the emptiest
	above             // over a curve's last point, where the axis leaves headroom
)

// addMarked marks one point with a ring and a label placed at where.
func addMarked(p *plot.Plot, x int, y float64, text string, where int) error {
	xy := plotter.XYs{{X: float64(x), Y: y}}
	s, err := plotter.NewScatter(xy)
	if err != nil {
		return err
	}
	s.GlyphStyle = draw.GlyphStyle{Shape: draw.RingGlyph{}, Radius: vg.Points(7), Color: plotutil.Color(3)}
	p.Add(s)
	off, xa, ya := vg.Point{X: vg.Points(8), Y: -vg.Points(8)}, draw.XLeft, draw.YTop
	if where == above {
		off, xa, ya = vg.Point{Y: vg.Points(10)}, draw.XCenter, draw.YBottom
	}
	return addText(p, xy, []string{text}, off, xa, ya)
}

// addText labels each point of xy with its line of text, offset and
// aligned as given.
func addText(p *plot.Plot, xy plotter.XYs, texts []string, off vg.Point, xa text.XAlignment, ya text.YAlignment) error {
	l, err := newLabels(xy, texts, off, xa, ya)
	if err != nil {
		return err
	}
	p.Add(l)
	return nil
}

func newLabels(xy plotter.XYs, texts []string, off vg.Point, xa text.XAlignment, ya text.YAlignment) (*plotter.Labels, error) {
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: xy, Labels: texts})
	if err != nil {
		return nil, err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].Font = labelFont()
		l.TextStyle[i].XAlign, l.TextStyle[i].YAlign = xa, ya
	}
	l.Offset = off
	return l, nil
}

// unpadded labels take no part in fitting the axes to the canvas: gonum
// pads for a label hanging below its point as if it rose above it, which
// leaves a band of empty plot. Whoever adds them sets the axis ranges so
// that they fit.
type unpadded struct{ *plotter.Labels }

func (unpadded) GlyphBoxes(*plot.Plot) []plot.GlyphBox { return nil }

// addLevel draws a dashed horizontal line at y over [x0, x1], labelled
// just above its left end or, with belowRight, just below its right end
// (so that two close levels' labels do not collide and no legend entry is
// needed).
func addLevel(p *plot.Plot, x0, x1, y float64, label string, where int) error {
	line, err := plotter.NewLine(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}})
	if err != nil {
		return err
	}
	line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
	p.Add(line)
	if where == belowRight {
		return addText(p, plotter.XYs{{X: x1, Y: y}}, []string{label}, vg.Point{Y: -vg.Points(3)}, draw.XRight, draw.YTop)
	}
	return addText(p, plotter.XYs{{X: x0, Y: y}}, []string{label}, vg.Point{Y: vg.Points(3)}, draw.XLeft, draw.YBottom)
}
