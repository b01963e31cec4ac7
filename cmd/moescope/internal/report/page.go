package report

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/plan"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// The page `moescope plan --report FILE.html` writes: one file with its
// style inline and the plots as inline SVG, so it opens anywhere without a
// network or the files beside it.
//
//go:embed page.html
var pageHTML string

var pageTemplate = template.Must(template.New("report").Parse(pageHTML))

// view is what the template lays out; every number is formatted here.
type view struct {
	Title         string
	Settings      [][2]string
	Notes         []string
	Explain       [2]string
	StageHead     []string
	Stages        [][]string
	PlanHead      []string
	Plans         [][]string
	KnobHead      []string
	Knobs         [][]string
	Breakdown     [][]string
	Comm, ByClass [][]string
	Overheads     [][]string
	Memory        [][]string
	Figures       []figure
	Calibration   *calibrationView
	Version       string
}

type figure struct {
	Name, Caption string
	SVG           template.HTML // rendered by renderFigure from our own data
}

type calibrationView struct {
	Params, Residuals [][]string
	Notes             []string
	Intervals         string
}

// captions say what each picture shows and how to read it.
var captions = map[string]string{
	"plan_lbs_tps":         "Modelled TPS per GPU against local batch at the target scale, one line per checkpointing policy (the best layout of that policy), up to the largest local batch within the memory target. The ring marks the best plan.",
	"plan_lbs_memory":      "Peak reserved memory (caching-allocator model) against local batch for the same layouts; the dashed line is the memory target. A plan must stay below it.",
	"plan_scaling":         "Job throughput of the best plan at each stage of the search against GPUs (log-log), beside ideal scaling from stage 1; labels give each stage's layout, policy, local batch and scaling efficiency.",
	"plan_breakdown":       "The best plan's step time split along the critical path of the slowest rank: compute, recompute, optimizer and the communication left exposed (not hidden behind compute), by collective.",
	"plan_memory_timeline": "Bytes allocated after each allocation or free of the best plan's step, in the order the memory model emits them, with the modelled peak reserved memory, the target and the device capacity.",
}

// Page is what the page says beside Data: the settings the plan was
// searched with, the best plan's explanation and remarks the command
// writes, and the command's version.
type Page struct {
	Title           string            // follows "moescope plan: " in the heading
	GPUs, Seq       int               // --gpus and --seq (tokens)
	GlobalBatch     int               // --global-batch in sequences; 0: free
	Top             int               // how many plans the plans table lists (--top)
	Calibration     *cost.Calibration // nil: uncalibrated
	CalibrationFile string            // --calibration, named when Calibration is set
	Explain         [2]string         // the best plan explained, as plan's table prints it
	Notes           []string          // remarks on what the search assumed
	Version         string            // what `moescope version` prints; "": the page says nothing of it
}

// Write renders the page of d and p to w: one HTML file with its style
// inline and the pictures as inline SVG.
func Write(w io.Writer, d *Data, p Page) error {
	rep := d.Search
	page := view{Title: "moescope plan: " + p.Title, Notes: p.Notes, Explain: p.Explain}
	page.Settings = settings(d, p)
	page.StageHead, page.Stages = stageRows(rep)
	page.PlanHead, page.Plans = planRows(rep, p.Top)
	page.KnobHead, page.Knobs = knobRows(rep.Knobs)
	page.Breakdown, page.Comm, page.ByClass, page.Overheads = breakdownRows(rep.Best.Score)
	page.Memory = memoryRows(d.Memory)
	figs, err := figures(d)
	if err != nil {
		return err
	}
	for _, n := range plotNames {
		b, err := renderFigure(figs[n], "svg")
		if err != nil {
			return fmt.Errorf("--report: plot %s: %w", n, err)
		}
		if i := bytes.Index(b, []byte("<svg")); i > 0 {
			b = b[i:] // drop the XML prolog: the SVG is inlined in HTML
		}
		page.Figures = append(page.Figures, figure{Name: n, Caption: captions[n], SVG: template.HTML(b)})
	}
	if p.Calibration != nil {
		page.Calibration = calibrationRows(p.Calibration)
	}
	if p.Version != "" {
		page.Version = "Written by " + strings.ReplaceAll(strings.TrimSpace(p.Version), "\n", "; ") + "."
	}
	return pageTemplate.Execute(w, page)
}

// settings are the inputs the page was computed from.
func settings(d *Data, p Page) [][2]string {
	rep := d.Search
	mode := "hierarchical (stages of growing GPU count)"
	if rep.Exhaustive {
		mode = "exhaustive at the target scale"
	}
	calText := "none (the cost model's defaults)"
	if p.Calibration != nil {
		calText = p.CalibrationFile
	}
	gb := rep.Best.Point.GlobalBatch()
	batch := fmt.Sprintf("free (no gradient accumulation): the best plan steps %d sequences, %s tokens", gb, Tokens(int64(gb)*int64(p.Seq)))
	if p.GlobalBatch > 0 {
		batch = fmt.Sprintf("%d sequences per optimizer step", p.GlobalBatch)
	}
	return [][2]string{
		{"model", d.Model}, {"GPUs", fmt.Sprint(p.GPUs)}, {"device", fmt.Sprintf("%s (%.2f GiB as PyTorch reports it)", d.GPU, d.DeviceGiB)},
		{"sequence length", fmt.Sprintf("%d tokens", p.Seq)}, {"global batch", batch},
		{"memory target", fmt.Sprintf("%.2f of device memory (peak reserved)", d.Target)},
		{"calibration", calText}, {"search", fmt.Sprintf("%s, %d candidates simulated", mode, rep.Simulated)},
	}
}

func stageRows(rep *plan.Report) ([]string, [][]string) {
	head := []string{"stage", "GPUs", "candidates", "pruned", "simulated", "carried", "best TPS per GPU", "scaling efficiency", "grew", "best layout"}
	var rows [][]string
	for i, st := range rep.Stages {
		carried, grew, best := "-", st.Grew, "-"
		if i < len(rep.Stages)-1 {
			carried = fmt.Sprint(len(st.Survivors))
		}
		if grew == "" {
			grew = "-"
		}
		if len(st.Survivors) > 0 {
			best = PointName(st.Survivors[0].Point)
		}
		rows = append(rows, []string{fmt.Sprint(i + 1), fmt.Sprint(st.GPUs), fmt.Sprint(st.Candidates), fmt.Sprint(st.Pruned),
			fmt.Sprint(st.Simulated), carried, fmt.Sprintf("%.0f", st.BestTPS), fmt.Sprintf("%.1f%%", 100*st.ScalingEfficiency), grew, best})
	}
	return head, rows
}

func planRows(rep *plan.Report, top int) ([]string, [][]string) {
	head := []string{"rank", "dp_shard", "dp_rep", "ep", "sharding", "options", "ac", "lbs", "accum", "TPS per GPU", "90% interval", "MFU (torchtitan)", "memory", "step s", "bottleneck"}
	var rows [][]string
	for i, r := range rep.Plans {
		if i == top {
			break
		}
		l := r.Point.Layout
		rows = append(rows, []string{fmt.Sprint(i + 1), fmt.Sprint(l.DPShard), fmt.Sprint(l.DPReplicate), fmt.Sprint(l.EP),
			string(l.Sharding), LayoutOptions(l), r.Point.AC.String(), fmt.Sprint(r.Point.LBS), fmt.Sprint(r.Point.GradAccum),
			fmt.Sprintf("%.0f", r.Score.TPS), intervalText(r.Score.TPSInterval), fmt.Sprintf("%.1f%%", 100*r.Score.MFU), fmt.Sprintf("%.1f%%", 100*r.Score.MemoryFraction),
			fmt.Sprintf("%.3f", r.Score.StepTimeS), r.Score.Bottleneck})
	}
	return head, rows
}

// knobRows are what turning each setting would change for the best plan
// (plan.KnobEffects), the plan first.
func knobRows(effects []plan.KnobEffect) ([]string, [][]string) {
	head := []string{"setting", "TPS per GPU", "90% interval", "change", "memory", "fits", "max lbs"}
	var rows [][]string
	for i, k := range effects {
		if k.Refused != "" {
			rows = append(rows, []string{k.Setting, "refused: " + k.Refused, "", "", "", "", ""})
			continue
		}
		change := "-"
		if i > 0 {
			change = fmt.Sprintf("%+.1f%%", 100*k.TPSChange)
		}
		rows = append(rows, []string{k.Setting, fmt.Sprintf("%.0f", k.TPS), intervalText(k.TPSInterval), change,
			fmt.Sprintf("%.1f%%", 100*k.MemoryFraction), map[bool]string{true: "yes", false: "no"}[k.Fits], fmt.Sprint(k.MaxLBS)})
	}
	return head, rows
}

// breakdownRows are the critical-path parts with their share, the
// collectives' total time by kind and compute by op class.
func breakdownRows(s plan.Score) (parts, comm, byClass, overheads [][]string) {
	for _, t := range StepParts(s.Breakdown) {
		parts = append(parts, []string{t.Name, fmt.Sprintf("%.4f", t.Seconds), fmt.Sprintf("%.1f%%", 100*t.Seconds/math.Max(s.StepTimeS, 1e-300))})
	}
	parts = append(parts, []string{"step", fmt.Sprintf("%.4f", s.StepTimeS), "100.0%"})
	for _, k := range sortedKeys(s.Breakdown.CommS) {
		comm = append(comm, []string{k, fmt.Sprintf("%.4f", s.Breakdown.CommS[k])})
	}
	for _, c := range cost.OpClasses() {
		if v, ok := s.Breakdown.ComputeByClassS[c.String()]; ok {
			byClass = append(byClass, []string{c.String(), fmt.Sprintf("%.4f", v)})
		}
	}
	for _, k := range sortedKeys(s.Breakdown.OverheadS) {
		overheads = append(overheads, []string{k, fmt.Sprintf("%.4f", s.Breakdown.OverheadS[k])})
	}
	return parts, comm, byClass, overheads
}

// memoryRows are the live bytes by category at the peak, the
// allocator overhead and the two peaks.
func memoryRows(r memory.Report) [][]string {
	b := r.Breakdown()
	row := func(name string, n int64) []string {
		return []string{name, fmt.Sprintf("%.2f", float64(n)/hw.GiB), fmt.Sprint(n)}
	}
	var rows [][]string
	for _, c := range memory.Categories() {
		rows = append(rows, row(string(c), b[string(c)]))
	}
	return append(rows, row("peak allocated", r.Peak.Allocated), row("allocator overhead (model)", b["allocator_overhead"]),
		row("peak reserved", r.Peak.Reserved))
}

// calibrationRows show what a calibration holds: each parameter's
// value and whether the fit moved it, its notes, and the residuals of the
// runs it was fitted on (predicted / measured − 1, the measured-vs-
// predicted comparison the file keeps).
func calibrationRows(cal *cost.Calibration) *calibrationView {
	v := &calibrationView{Notes: cal.Notes}
	status := map[string]string{}
	for _, n := range cal.Fitted {
		status[n] = "fitted"
	}
	for _, n := range cal.Kept {
		status[n] = "kept at its default (not identified by the runs)"
	}
	for _, p := range []struct {
		name string
		v    float64
	}{{cost.CalCompute, cal.ComputeScale}, {cost.CalGEMM, cal.GEMMScale}, {cost.CalGrouped, cal.GroupedScale}, {cost.CalAttention, cal.AttentionScale},
		{cost.CalMemoryBound, cal.MemoryBoundScale}, {cost.CalNVLink, cal.NVLinkEfficiency}, {cost.CalNet, cal.NetEfficiency},
		{cost.CalAllocator, cal.AllocatorOverhead}} {
		val := "default"
		if p.v > 0 {
			val = fmt.Sprintf("%.4g", p.v)
		}
		st := status[p.name]
		if st == "" {
			st = "-"
		}
		v.Params = append(v.Params, []string{p.name, val, st})
	}
	for i, r := range cal.Residuals {
		mem := "not measured"
		if i < len(cal.MemoryResiduals) && cal.MemoryResiduals[i] != nil {
			mem = fmt.Sprintf("%+.1f%%", 100**cal.MemoryResiduals[i])
		}
		name := fmt.Sprint(i)
		if i < len(cal.ResidualRuns) {
			name = cal.ResidualRuns[i]
		}
		v.Residuals = append(v.Residuals, []string{name, fmt.Sprintf("%+.1f%%", 100*r), mem})
	}
	v.Intervals = "This calibration carries no fit covariance, so the plans' intervals above are the model's uncalibrated band over the published runs; the residuals are how far the calibrated model was from the runs it was fitted on."
	if len(cal.Covariance) > 0 {
		v.Intervals = fmt.Sprintf("Intervals: the fit's covariance over %s and a residual spread of %.1f%% give each reported plan's TPS a 90%% interval (the plans table); a run outside it means the model or the calibration runs do not cover that layout.",
			strings.Join(cal.CovarianceParams, ", "), 100*cal.ResidualSD)
	}
	return v
}

// intervalText is a TPS interval as "[low, high]", or "-" without one.
func intervalText(iv *[2]float64) string {
	if iv == nil {
		return "-"
	}
	return fmt.Sprintf("[%.0f, %.0f]", iv[0], iv[1])
}

func sortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
