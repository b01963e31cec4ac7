package report

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/parallel/plan"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// plotNames are the pictures `moescope plan --plot DIR` writes, each as
// .png and .svg, in the order the report shows them.
var plotNames = []string{"plan_lbs_tps", "plan_lbs_memory", "plan_scaling", "plan_breakdown", "plan_memory_timeline"}

// PlotNames are the names of the pictures, without extension, in the order
// the page shows them; WritePlots writes each as .png and .svg.
func PlotNames() []string { return slices.Clone(plotNames) }

// Figure size: large enough that a 30-character legend entry and a
// two-line point label fit beside four stages without crowding.
const (
	figureWidth  = 24 * vg.Centimeter
	figureHeight = 15 * vg.Centimeter
)

// PlotPaths lists the files WritePlots writes into dir.
func PlotPaths(dir string) []string {
	var out []string
	for _, n := range plotNames {
		for _, ext := range []string{".png", ".svg"} {
			out = append(out, filepath.Join(dir, n+ext))
		}
	}
	return out
}

// CheckPlots refuses, before a search, a --plot directory WritePlots could
// not write into: it is made at the end (MkdirAll), so its nearest
// existing ancestor (or itself) must be a directory, and none of the files
// it will hold may exist unless force.
func CheckPlots(dir string, force bool) error {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err == nil && !st.IsDir() {
			return fmt.Errorf("--plot %s: %s is not a directory", dir, d)
		}
		if err == nil || d == filepath.Dir(d) {
			break
		}
	}
	for _, p := range PlotPaths(dir) {
		if _, err := os.Lstat(p); err == nil && !force {
			return fmt.Errorf("%s: %w", p, fileio.ErrExists)
		}
	}
	return nil
}

// Data is what the pictures show: the search, the local-batch sweeps at
// the target scale and the best plan's memory timeline.
type Data struct {
	Search     *plan.Report  // the search; its best plan is the one drawn
	Model, GPU string        // the names the titles give
	DeviceGiB  float64       // capacity as PyTorch reports it
	Target     float64       // --memory-target, a fraction of DeviceGiB
	Sweeps     []plan.Sweep  // from TargetSweeps
	Memory     memory.Report // the best plan's step timeline (one GPU)
}

// figures builds every picture, keyed by plotNames.
func figures(d *Data) (map[string]*plot.Plot, error) {
	figs := map[string]*plot.Plot{}
	var err error
	if figs["plan_lbs_tps"], figs["plan_lbs_memory"], err = plotSweeps(d); err != nil {
		return nil, err
	}
	if figs["plan_scaling"], err = plotScaling(d); err != nil {
		return nil, err
	}
	if figs["plan_breakdown"], err = plotBreakdown(d); err != nil {
		return nil, err
	}
	if figs["plan_memory_timeline"], err = plotMemoryTimeline(d); err != nil {
		return nil, err
	}
	return figs, nil
}

// WritePlots renders the pictures into dir (created if missing), saying
// "wrote FILE" on stderr for each, as PlotPaths lists them. Existing files are
// refused unless force; every file is written atomically.
func WritePlots(stderr io.Writer, dir string, force bool, d *Data) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	if err := CheckPlots(dir, force); err != nil {
		return err
	}
	figs, err := figures(d)
	if err != nil {
		return err
	}
	for _, n := range plotNames {
		for _, ext := range []string{"png", "svg"} {
			b, err := renderFigure(figs[n], ext)
			if err != nil {
				return fmt.Errorf("--plot %s.%s: %w", n, ext, err)
			}
			path := filepath.Join(dir, n+"."+ext)
			if err := fileio.WriteFileAtomic(path, force, func(w io.Writer) error {
				_, err := w.Write(b)
				return err
			}); err != nil {
				return err
			}
			fmt.Fprintf(stderr, "wrote %s\n", path)
		}
	}
	return nil
}

// renderFigure draws p in format (png or svg) with its legend in a band
// below the axes, where it can never cover a curve.
func renderFigure(p *plot.Plot, format string) ([]byte, error) {
	c, err := draw.NewFormattedCanvas(figureWidth, figureHeight, format)
	if err != nil {
		return nil, err
	}
	dc := draw.New(c)
	leg := p.Legend
	p.Legend = plot.NewLegend() // an empty legend draws nothing
	defer func() { p.Legend = leg }()
	band := vg.Length(0)
	if r := leg.Rectangle(dc); r.Max.Y > r.Min.Y {
		band = r.Max.Y - r.Min.Y + 0.5*vg.Centimeter
	}
	p.Draw(draw.Crop(dc, 0, 0, band, 0))
	if band > 0 {
		leg.Top, leg.Left = true, true
		leg.XOffs = 1.5 * vg.Centimeter
		leg.Draw(draw.Crop(dc, 0, 0, 0.2*vg.Centimeter, band-figureHeight))
	}
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// newFigure is a plot with the sizes every picture uses: a 14 pt title,
// 12 pt axis titles and legend, 11 pt ticks.
func newFigure(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = 14
	p.Title.Padding = 0.3 * vg.Centimeter
	p.X.Label.Text, p.Y.Label.Text = x, y
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font.Size = 12
		a.Tick.Label.Font.Size = 11
		a.Tick.Marker = linearTicks{}
	}
	p.Legend.TextStyle.Font.Size = 12
	p.Legend.ThumbnailWidth = 1.2 * vg.Centimeter
	return p
}

// linearTicks labels about six round values (1, 2 or 5 × 10^k apart)
// printed without trailing zeros; gonum's default can leave two labels,
// both with two decimals ("0.00", "25000.00").
type linearTicks struct{}

func (linearTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return []plot.Tick{{Value: lo, Label: strconv.FormatFloat(lo, 'f', -1, 64)}}
	}
	raw := (hi - lo) / 6
	step := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*step >= raw {
			step *= m
			break
		}
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		v = math.Round(v/step) * step // no accumulated rounding in labels
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
		if mid := v + step/2; mid < hi {
			ticks = append(ticks, plot.Tick{Value: mid}) // an unlabelled minor tick
		}
	}
	return ticks
}

// labelFont is the font of labels drawn beside data.
func labelFont() font.Font {
	f := plot.DefaultFont
	f.Size = 11
	return f
}
