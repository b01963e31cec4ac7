package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel/hw"
)

func init() {
	register(command{"flops", "parameters and FLOPs per layer, op and convention; MFU from a measured TPS", runFlops})
}

// flopsReport is the --json output of `moescope flops` (schema in docs/flops.md).
type flopsReport struct {
	Model     string    `json:"model"`
	ModelType string    `json:"model_type"`
	Source    string    `json:"source"`
	Seq       int       `json:"seq"`
	Batch     int       `json:"batch"`
	Tokens    int64     `json:"tokens"`
	AC        moe.AC    `json:"ac"`
	Tile      [2]int    `json:"attention_tile"`
	Params    flopsPars `json:"params"`
	// FLOPsPerToken and FLOPsPerStep are keyed by convention.
	FLOPsPerToken map[flops.Convention]float64 `json:"flops_per_token"`
	FLOPsPerStep  map[flops.Convention]int64   `json:"flops_per_step"`
	Conventions   map[flops.Convention]string  `json:"conventions"`
	NonMatmul     map[moe.Op]int64             `json:"non_matmul_elements"`
	// NonMatmulFLOPs is NonMatmul × flops.ElementCost, per op (moescope's
	// per-element costs; no published convention counts this work).
	NonMatmulFLOPs map[moe.Op]int64 `json:"non_matmul_flops"`
	Layers         []flops.LayerRow `json:"layers"`
	// MTPModules is num_nextn_predict_layers, left out of every figure;
	// MTP counts them, only with --mtp.
	MTPModules int        `json:"mtp_modules"`
	MTP        *mtpReport `json:"mtp,omitempty"`
	// Set only with --tps.
	GPU             string                       `json:"gpu,omitempty"`
	PeakFLOPs       float64                      `json:"peak_flops,omitempty"`
	TPS             float64                      `json:"tps,omitempty"`
	MFUByConvention map[flops.Convention]float64 `json:"mfu_by_convention,omitempty"`
	HFU             *float64                     `json:"hfu,omitempty"`
}

type flopsPars struct {
	Total   int64                       `json:"total"`
	Active  int64                       `json:"active"`
	ByGroup map[moe.ParamGroup]parGroup `json:"by_group"`
}

type parGroup struct {
	Total  int64 `json:"total"`
	Active int64 `json:"active"`
}

// parseTile reads "R" (square) or "RxC".
func parseTile(s string) (flops.Tile, error) {
	rs, cs, ok := strings.Cut(strings.ToLower(s), "x")
	if !ok {
		cs = rs
	}
	r, err1 := strconv.Atoi(rs)
	c, err2 := strconv.Atoi(cs)
	t := flops.Tile{Rows: r, Cols: c}
	if err1 != nil || err2 != nil {
		return t, fmt.Errorf("--tile = %q: want ROWSxCOLS, e.g. 128x128", s)
	}
	if err := t.Validate(); err != nil {
		return t, fmt.Errorf("--tile: %v", err)
	}
	return t, nil
}

// maxTPS bounds --tps, a measured per-GPU rate: the fastest published
// training runs reach about 2e5 tokens/s per GPU (llm.c: GPT-2 124M, 10B
// tokens in 90 minutes on 8 A100s); 1e9 is 5000 times that, so that every
// MFU printed is finite and a typo (1e300) is refused.
const maxTPS = 1e9

func runFlops(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("flops", stderr)
	model := fs.String("model", "", "built-in model name or config.json path (moescope models lists the built-ins)")
	seq := fs.Int("seq", 4096, "tokens per sequence")
	batch := fs.Int("batch", 1, "sequences per step (per-step totals only)")
	acFlag := addACFlag(fs, "selective", "the hardware convention's recompute")
	tileFlag := fs.String("tile", "128x128", "flash-attention tile ROWSxCOLS for the hardware convention")
	gpu := fs.String("gpu", hw.DefaultDeviceName, "device whose BF16 dense peak MFU divides by")
	tps := fs.Float64("tps", 0, fmt.Sprintf("measured tokens per second per GPU, in (0, %g]; prints MFU per convention and HFU", maxTPS))
	asJSON := fs.Bool("json", false, "print one JSON object")
	mtp := fs.Bool("mtp", false, "also count the multi-token-prediction modules (num_nextn_predict_layers), which Hugging Face's model ignores")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ac, err := moe.ParseAC(*acFlag)
	if err != nil {
		return fmt.Errorf("%w: --ac: %v", errUsage, err)
	}
	tile, err := parseTile(*tileFlag)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	shape := flops.Shape{Seq: *seq, Batch: *batch}
	if err := shape.Validate(); err != nil {
		return fmt.Errorf("%w: --%v", errUsage, err)
	}
	set := setFlags(fs)
	if set["gpu"] && !set["tps"] {
		return fmt.Errorf("%w: --gpu = %s: used only with --tps (the peak MFU divides by); give --tps or leave --gpu out", errUsage, *gpu)
	}
	if set["tps"] && !(*tps > 0 && *tps <= maxTPS) {
		return fmt.Errorf("%w: --tps = %v: must be in (0, %g] tokens/s per GPU", errUsage, *tps, maxTPS)
	}
	dev, err := hw.LookupDevice(*gpu)
	if err != nil {
		return fmt.Errorf("%w: --gpu: %v", errUsage, err)
	}
	cfg, err := loadModel(*model)
	if err != nil {
		return err
	}
	rep, err := buildFlopsReport(cfg, shape, ac, tile)
	if err != nil {
		return fmt.Errorf("%s: %w", cfg.Name, err)
	}
	if *mtp {
		if rep.MTP, err = buildMTP(cfg, shape, rep.FLOPsPerStep[flops.Model]); err != nil {
			return err
		}
	}
	if *tps > 0 {
		rep.GPU, rep.PeakFLOPs, rep.TPS = dev.Name, dev.BF16FLOPs, *tps
		rep.MFUByConvention = map[flops.Convention]float64{}
		for _, c := range flops.AllConventions() {
			rep.MFUByConvention[c] = flops.MFU(rep.FLOPsPerToken[c], *tps, dev.BF16FLOPs)
		}
		h := flops.HFU(rep.FLOPsPerToken[flops.Hardware], *tps, dev.BF16FLOPs)
		rep.HFU = &h
	}
	if *asJSON {
		return writeJSON(stdout, "flops", rep)
	}
	return printFlops(stdout, rep)
}

func buildFlopsReport(cfg *moe.Config, s flops.Shape, ac moe.AC, tile flops.Tile) (*flopsReport, error) {
	p, err := flops.CountParams(cfg)
	if err != nil {
		return nil, err
	}
	tot, err := flops.Count(cfg, s, ac, tile)
	if err != nil {
		return nil, err
	}
	recs, err := flops.Ops(cfg, s, ac, tile)
	if err != nil {
		return nil, err
	}
	layers, err := flops.Layers(cfg, recs)
	if err != nil {
		return nil, err
	}
	nm, err := flops.NonMatmul(recs)
	if err != nil {
		return nil, err
	}
	nmFLOPs, err := flops.NonMatmulFLOPs(cfg, recs)
	if err != nil {
		return nil, err
	}
	rep := &flopsReport{
		Model: cfg.Name, ModelType: cfg.ModelType, Source: cfg.Source,
		Seq: s.Seq, Batch: s.Batch, Tokens: s.Tokens(), AC: ac, Tile: [2]int{tile.Rows, tile.Cols},
		Params:        flopsPars{Total: p.Total, Active: p.Active, ByGroup: map[moe.ParamGroup]parGroup{}},
		FLOPsPerToken: tot.PerToken, FLOPsPerStep: tot.PerStep,
		Conventions: map[flops.Convention]string{}, NonMatmul: nm, NonMatmulFLOPs: nmFLOPs, Layers: layers,
		MTPModules: cfg.MTPLayers,
	}
	for _, g := range moe.Groups() {
		if p.ByGroup[g] > 0 {
			rep.Params.ByGroup[g] = parGroup{p.ByGroup[g], p.ActiveByGroup[g]}
		}
	}
	for _, c := range flops.AllConventions() {
		rep.Conventions[c] = c.Explain()
	}
	return rep, nil
}

// fmtFLOPs writes a FLOP count in engineering form: 2.791e+10.
func fmtFLOPs(v float64) string { return strconv.FormatFloat(v, 'e', 4, 64) }

// printFlopsByOp prints the matmul FLOPs of each op summed over layers, by
// pass.
func printFlopsByOp(w io.Writer, r *flopsReport) {
	fmt.Fprintf(w, "\nper-op matmul FLOPs of the step, all layers (hardware count: --ac %s, tile %dx%d)\n", r.AC, r.Tile[0], r.Tile[1])
	type agg struct{ f, bd, bw, rec int64 }
	var order []moe.Op
	byOp := map[moe.Op]*agg{}
	for _, l := range r.Layers {
		for _, o := range l.Ops {
			if o.Unit != "flops" {
				continue
			}
			a, ok := byOp[o.Op]
			if !ok {
				a = &agg{}
				byOp[o.Op] = a
				order = append(order, o.Op)
			}
			a.f += o.Forward
			a.bd += o.BackwardData
			a.bw += o.BackwardWeight
			a.rec += o.Recompute
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tforward\tbackward_data\tbackward_weight\trecompute\t")
	for _, op := range order {
		a := byOp[op]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", op, fmtFLOPs(float64(a.f)), fmtFLOPs(float64(a.bd)), fmtFLOPs(float64(a.bw)), fmtFLOPs(float64(a.rec)))
	}
	tw.Flush()
}

// printFlopsByLayer prints the matmul FLOPs of each layer, runs of
// identical layers on one line.
func printFlopsByLayer(w io.Writer, r *flopsReport) {
	fmt.Fprintln(w, "\nper-layer matmul FLOPs of the step (runs of identical layers on one line, values per layer)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "layers\tkind\tforward\tbackward_data\tbackward_weight\trecompute\t")
	type lrow struct {
		first, last int
		kind        string
		v           [4]int64
	}
	var runs []lrow
	for _, l := range r.Layers {
		f, bd, bw, rec := l.MatmulFLOPs()
		v := [4]int64{f, bd, bw, rec}
		if n := len(runs); n > 0 && runs[n-1].kind == l.Kind && runs[n-1].v == v && l.Kind != "embed" && l.Kind != "head" {
			runs[n-1].last = l.Layer
			continue
		}
		runs = append(runs, lrow{l.Layer, l.Layer, l.Kind, v})
	}
	for _, x := range runs {
		name := fmt.Sprintf("%d-%d", x.first, x.last)
		switch {
		case x.kind == "embed" || x.kind == "head":
			name = "-"
		case x.first == x.last:
			name = strconv.Itoa(x.first)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", name, x.kind, fmtFLOPs(float64(x.v[0])), fmtFLOPs(float64(x.v[1])), fmtFLOPs(float64(x.v[2])), fmtFLOPs(float64(x.v[3])))
	}
	tw.Flush()
}

func printFlops(w io.Writer, r *flopsReport) error {
	fmt.Fprintf(w, "model %s (%s)\n  source: %s\n", r.Model, r.ModelType, r.Source)
	fmt.Fprintf(w, "step: %d sequence(s) x %d tokens = %s tokens; --ac %s; attention tile %dx%d\n\n",
		r.Batch, r.Seq, fmtInt(r.Tokens), r.AC, r.Tile[0], r.Tile[1])

	fmt.Fprintf(w, "parameters: total %s (%s), active per token %s (%s)\n", fmtInt(r.Params.Total), fmtBillions(r.Params.Total),
		fmtInt(r.Params.Active), fmtBillions(r.Params.Active))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "group\ttotal\tactive\t")
	for _, g := range moe.Groups() {
		if pg, ok := r.Params.ByGroup[g]; ok {
			fmt.Fprintf(tw, "%s\t%s\t%s\t\n", g, fmtInt(pg.Total), fmtInt(pg.Active))
		}
	}
	tw.Flush()
	printMTP(w, r)

	printFlopsByOp(w, r)
	printFlopsByLayer(w, r)

	fmt.Fprintln(w, "\nnon-matmul work of the step, all passes (no convention counts it; FLOPs at moescope's per-element costs, flops.ElementCost)")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	var nmOrder []moe.Op
	seen := map[moe.Op]bool{}
	for _, l := range r.Layers {
		for _, o := range l.Ops {
			if o.Unit == "elements" && !seen[o.Op] {
				seen[o.Op] = true
				nmOrder = append(nmOrder, o.Op)
			}
		}
	}
	for _, op := range nmOrder {
		fmt.Fprintf(tw, "%s\t%s elements\t%s FLOPs\t\n", op, fmtInt(r.NonMatmul[op]), fmtInt(r.NonMatmulFLOPs[op]))
	}
	tw.Flush()

	fmt.Fprintln(w, "\nFLOPs by convention")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "convention\tper token\tper step"
	if r.MFUByConvention != nil {
		head += fmt.Sprintf("\tMFU (%s, %s tok/s)", r.GPU, strconv.FormatFloat(r.TPS, 'f', -1, 64))
	}
	fmt.Fprintln(tw, head+"\thow it counts")
	for _, c := range flops.AllConventions() {
		line := fmt.Sprintf("%s\t%s\t%s", c, fmtFLOPs(r.FLOPsPerToken[c]), fmtInt(r.FLOPsPerStep[c]))
		if r.MFUByConvention != nil {
			line += fmt.Sprintf("\t%.2f%%", 100*r.MFUByConvention[c])
		}
		fmt.Fprintln(tw, line+"\t"+r.Conventions[c])
	}
	tw.Flush()
	if r.HFU != nil {
		fmt.Fprintf(w, "\nHFU (hardware FLOPs, %s BF16 dense peak %s FLOP/s): %.2f%%\n", r.GPU, fmtFLOPs(r.PeakFLOPs), 100**r.HFU)
	}
	return nil
}
