package validate

import (
	"fmt"
	"sort"
	"strings"

	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/calib"
	"github.com/moescope/moescope/parallel/sim/cost"
	"github.com/moescope/moescope/parallel/sim/published"
)

// TPSTable is the TPS validation: every run's measured tokens per second
// per GPU beside the uncalibrated prediction and, in a series with runs
// above its small scale, the prediction calibrated on the series'
// small-scale runs.
type TPSTable struct {
	Series []Series `json:"series"`
	// PowerLimited are the runs left out: the time model cannot price
	// GPUs held below their default power limit (published.Run's
	// power_limited).
	PowerLimited []PowerLimitedRun `json:"power_limited,omitempty"`
	// Uncalibrated summarizes every row's uncalibrated error (frameworks
	// other than torchtitan's included); TensorParallel those of the rows
	// with tp > 1; Calibrated the calibrated errors of the rows above
	// their series' small scale. Each is absent without rows.
	Uncalibrated   *Summary `json:"uncalibrated_error,omitempty"`
	TensorParallel *Summary `json:"tensor_parallel_uncalibrated_error,omitempty"`
	Calibrated     *Summary `json:"calibrated_error,omitempty"`
	// ByRecipe summarizes each priced recipe's rows (uncalibrated), in
	// job.PricedPrecisions' order, and LowPrecision the low-precision
	// recipes' rows together: the bar of the low-precision issue (32),
	// printed, not enforced (most such rows are Megatron-Core's, whose
	// kernels and releases moescope does not model).
	ByRecipe     []RecipeSummary `json:"uncalibrated_error_by_recipe,omitempty"`
	LowPrecision *Summary        `json:"low_precision_uncalibrated_error,omitempty"`
}

// RecipeSummary is one recipe's summary.
type RecipeSummary struct {
	Recipe job.Precision `json:"recipe"`
	Summary
}

// Series is the calibration issue's series: the runs of one source file,
// model, GPU, precision and framework version, in GPU count order.
type Series struct {
	File             string `json:"file"`
	Model            string `json:"model"`
	GPU              string `json:"gpu"`
	Precision        string `json:"precision"`
	FrameworkVersion string `json:"framework_version,omitempty"`
	// SmallScale is the fewest GPUs among its runs of two or more (0: none).
	// When a run is larger, the series is Calibrated on every run at the
	// small scale, and CalibratedError summarizes its larger runs'
	// calibrated errors.
	SmallScale      int      `json:"small_scale_gpus"`
	Calibrated      bool     `json:"calibrated"`
	CalibratedError *Summary `json:"calibrated_error,omitempty"`
	Rows            []TPSRow `json:"runs"`
}

// TPSRow is one run's line of the TPS table. Errors are relative
// (predicted / measured − 1).
type TPSRow struct {
	Name      string `json:"name"` // run_id and model, "(compiled)" under torch.compile
	RunID     string `json:"run_id,omitempty"`
	Model     string `json:"model"`
	GPU       string `json:"gpu"`
	GPUs      int    `json:"gpus"`
	Layout    string `json:"layout"` // [ppN×]dp_replicate×dp_shard[×tpN]
	TP        int    `json:"tp"`
	LBS       int    `json:"lbs"`
	AC        string `json:"ac"`
	Precision string `json:"precision"`
	// Recipe is the recipe the precision text names ("" when it names
	// none moescope knows).
	Recipe            job.Precision `json:"recipe,omitempty"`
	Measured          float64       `json:"measured_tps"`
	Uncalibrated      float64       `json:"uncalibrated_tps"`
	UncalibratedError float64       `json:"uncalibrated_error"`
	// Calibrated and CalibratedError are absent outside a calibrated
	// series and for a pipeline run (calibration fits single-program
	// runs). Fit marks a run the calibration was fitted to;
	// AboveSmallScale one whose calibrated error the summaries count.
	Calibrated      *float64 `json:"calibrated_tps,omitempty"`
	CalibratedError *float64 `json:"calibrated_error,omitempty"`
	Fit             bool     `json:"fit,omitempty"`
	AboveSmallScale bool     `json:"above_small_scale,omitempty"`
	// FrameworkNotModelled marks a run of another framework than the
	// torchtitan moescope models, or of a torchtitan whose changes the
	// run's unmodelled field names (a fork). Such rows count in the
	// summaries.
	Framework            string `json:"framework,omitempty"`
	FrameworkNotModelled bool   `json:"framework_not_modelled,omitempty"`

	run published.Run // the run predicted (for Pairs)
}

// PowerLimitedRun is a run the TPS table leaves out for its power limit.
type PowerLimitedRun struct {
	Label string `json:"run"`
	Model string `json:"model"`
	GPU   string `json:"gpu"`
	GPUs  int    `json:"gpus"`
}

// TPS predicts every run (uncalibrated, and calibrated per series) and
// summarizes the errors. A run it cannot predict, or a series it cannot
// calibrate, is an error naming it.
func TPS(runs []published.Run) (TPSTable, error) {
	var t TPSTable
	var uncal, tp, cal []float64
	for _, rs := range groupSeries(runs) {
		s, limited, err := predictSeries(rs)
		if err != nil {
			return TPSTable{}, err
		}
		t.PowerLimited = append(t.PowerLimited, limited...)
		if len(s.Rows) == 0 {
			continue
		}
		for _, row := range s.Rows {
			uncal = append(uncal, row.UncalibratedError)
			if row.TP > 1 {
				tp = append(tp, row.UncalibratedError)
			}
			if row.AboveSmallScale {
				cal = append(cal, *row.CalibratedError)
			}
		}
		t.Series = append(t.Series, s)
	}
	t.Uncalibrated, t.TensorParallel, t.Calibrated = summarize(uncal), summarize(tp), summarize(cal)
	t.ByRecipe, t.LowPrecision = summarizeRecipes(t.Series)
	return t, nil
}

// summarizeRecipes summarizes the uncalibrated errors per priced recipe
// and over the low-precision ones together.
func summarizeRecipes(series []Series) ([]RecipeSummary, *Summary) {
	by := map[job.Precision][]float64{}
	for _, s := range series {
		for _, row := range s.Rows {
			by[row.Recipe] = append(by[row.Recipe], row.UncalibratedError)
		}
	}
	var out []RecipeSummary
	var low []float64
	for _, p := range job.PricedPrecisions {
		if s := summarize(by[p]); s != nil {
			out = append(out, RecipeSummary{Recipe: p, Summary: *s})
			if p.LowPrecision() {
				low = append(low, by[p]...)
			}
		}
	}
	return out, summarize(low)
}

// seriesKey names run r's series: its source file, model, GPU, precision
// and framework version.
func seriesKey(r published.Run) string {
	return fmt.Sprintf("%s|%s|%s|%s|%s", r.File, r.Model, r.GPU, r.Precision, r.FrameworkVersion)
}

// groupSeries splits runs into series in the order each series first
// appears, each series' runs in their order.
func groupSeries(runs []published.Run) [][]published.Run {
	index := map[string]int{}
	var out [][]published.Run
	for _, r := range runs {
		k := seriesKey(r)
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], r)
	}
	return out
}

// predictSeries predicts one series' runs, leaving out the power-limited
// ones, and calibrates it on its small-scale runs when it has larger ones.
func predictSeries(all []published.Run) (Series, []PowerLimitedRun, error) {
	r0 := all[0]
	s := Series{File: r0.File, Model: r0.Model, GPU: r0.GPU, Precision: r0.Precision, FrameworkVersion: r0.FrameworkVersion}
	var rs []published.Run
	var limited []PowerLimitedRun
	for _, r := range all {
		if r.PowerLimited {
			limited = append(limited, PowerLimitedRun{Label: r.Label(), Model: r.Model, GPU: r.GPU, GPUs: r.GPUs})
			continue
		}
		rs = append(rs, r)
	}
	if len(rs) == 0 {
		return s, limited, nil
	}
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].GPUs < rs[j].GPUs })
	s.SmallScale = smallScale(rs)
	cal, err := calibrateSeries(rs, s.SmallScale)
	if err != nil {
		return s, nil, err
	}
	s.Calibrated = cal != nil
	var calErrs []float64
	for _, r := range rs {
		row, err := predictRow(r, cal, r.GPUs == s.SmallScale)
		if err != nil {
			return s, nil, fmt.Errorf("run %s (%s): %w", r.Label(), r.File, err)
		}
		if row.CalibratedError != nil && r.GPUs > s.SmallScale {
			row.AboveSmallScale = true
			calErrs = append(calErrs, *row.CalibratedError)
		}
		s.Rows = append(s.Rows, row)
	}
	s.CalibratedError = summarize(calErrs)
	return s, limited, nil
}

// smallScale is a series' small scale: its fewest GPUs among runs of two
// or more (a single-GPU run has no collectives and no sharding wrapper, so
// it cannot stand for the distributed runs), or 0 when it has none.
func smallScale(rs []published.Run) int {
	n := 0
	for _, r := range rs {
		if r.GPUs >= 2 && (n == 0 || r.GPUs < n) {
			n = r.GPUs
		}
	}
	return n
}

// calibrateSeries fits a calibration to the runs at the small scale, or
// returns nil when the series has no run above it (nothing to validate).
// rs is in GPU count order.
func calibrateSeries(rs []published.Run, small int) (*cost.Calibration, error) {
	if small == 0 || rs[len(rs)-1].GPUs <= small {
		return nil, nil
	}
	var fit []published.Run
	for _, r := range rs {
		if r.GPUs == small {
			fit = append(fit, r)
		}
	}
	cal, err := calib.Calibrate(fit)
	if err != nil {
		r := rs[0]
		return nil, fmt.Errorf("series %s (%s on %s, %s): calibrate on its %d-GPU runs: %w", r.File, r.Model, r.GPU, r.Precision, small, err)
	}
	return cal, nil
}

// predictRow predicts run r uncalibrated and, with cal, calibrated (not
// under pipeline parallelism: calibration fits single-program runs). fit
// marks a run the calibration was fitted to.
func predictRow(r published.Run, cal *cost.Calibration, fit bool) (TPSRow, error) {
	row := newTPSRow(r)
	in, err := published.InputForRun(r)
	if err != nil {
		return row, err
	}
	if r.PP > 1 {
		un, err := sim.Simulate(in)
		if err != nil {
			return row, err
		}
		row.setUncalibrated(un.TPS)
		return row, nil
	}
	p, err := sim.Prepare(in)
	if err != nil {
		return row, err
	}
	un, err := p.Run(nil)
	if err != nil {
		return row, err
	}
	row.setUncalibrated(un.TPS)
	if cal != nil {
		c, err := p.Run(cal)
		if err != nil {
			return row, err
		}
		e := c.TPS/r.TPS - 1
		row.Calibrated, row.CalibratedError, row.Fit = &c.TPS, &e, fit
	}
	return row, nil
}

// setUncalibrated records the uncalibrated prediction and its error.
func (row *TPSRow) setUncalibrated(tps float64) {
	row.Uncalibrated, row.UncalibratedError = tps, tps/row.Measured-1
}

// newTPSRow is run r's row before prediction: its name, layout and
// measured TPS.
func newTPSRow(r published.Run) TPSRow {
	name := r.Model
	if j := strings.LastIndex(name, "/"); j >= 0 {
		name = name[j+1:]
	}
	if r.Compile {
		name += " (compiled)"
	}
	if r.RunID != "" {
		name = r.RunID + " " + name
	}
	recipe, _ := r.PrecisionRecipe() // "" when the text names no recipe: counted under none
	return TPSRow{run: r, Name: name, RunID: r.RunID, Model: r.Model, GPU: r.GPU, GPUs: r.GPUs, Layout: tpsLayout(r), TP: r.TP,
		LBS: r.LBS, AC: r.AC.String(), Precision: r.Precision, Recipe: recipe, Measured: r.TPS, Framework: r.Framework,
		FrameworkNotModelled: !strings.HasPrefix(r.Framework, "torchtitan") || r.Unmodelled != ""}
}

// tpsLayout prints a run's dp_replicate × dp_shard, with pp× before it
// under pipeline parallelism and × tp after it under tensor parallelism.
func tpsLayout(r published.Run) string {
	s := fmt.Sprintf("%d×%d", r.DPReplicate, r.DPShard)
	if r.PP > 1 {
		s = fmt.Sprintf("pp%d×", r.PP) + s
	}
	if r.TP > 1 {
		s += fmt.Sprintf("×tp%d", r.TP)
	}
	return s
}
