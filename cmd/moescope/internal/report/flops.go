package report

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe"
)

// Flops is the --json output of `moescope flops` (schema in docs/flops.md).
type Flops struct {
	Model     string      `json:"model"`
	ModelType string      `json:"model_type"`
	Source    string      `json:"source"`
	Seq       int         `json:"seq"`
	Batch     int         `json:"batch"`
	Tokens    int64       `json:"tokens"`
	AC        moe.AC      `json:"ac"`
	Tile      [2]int      `json:"attention_tile"`
	Params    FlopsParams `json:"params"`
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
	MTPModules int  `json:"mtp_modules"`
	MTP        *MTP `json:"mtp,omitempty"`
	// Set only with --tps.
	GPU             string                       `json:"gpu,omitempty"`
	PeakFLOPs       float64                      `json:"peak_flops,omitempty"`
	TPS             float64                      `json:"tps,omitempty"`
	MFUByConvention map[flops.Convention]float64 `json:"mfu_by_convention,omitempty"`
	HFU             *float64                     `json:"hfu,omitempty"`
}

type FlopsParams struct {
	Total   int64                          `json:"total"`
	Active  int64                          `json:"active"`
	ByGroup map[moe.ParamGroup]GroupParams `json:"by_group"`
}

type GroupParams struct {
	Total  int64 `json:"total"`
	Active int64 `json:"active"`
}

// MTP is `moescope flops --mtp`'s count of the multi-token-prediction
// modules (num_nextn_predict_layers), which every other figure leaves out.
type MTP struct {
	Modules      int   `json:"modules"`
	ParamsTotal  int64 `json:"params_total"`
	ParamsActive int64 `json:"params_active"`
	// Megatron-LM's num_floating_point_operations with --mtp-num-layers =
	// modules (main model included), the one published convention with an
	// MTP term.
	MegatronPerToken float64 `json:"megatron_flops_per_token"`
	MegatronPerStep  int64   `json:"megatron_flops_per_step"`
	// The modules alone in the model convention (flops.MTPModelPerStep),
	// and the main model's model-convention count with them.
	ModelPerToken      float64 `json:"model_flops_per_token"`
	ModelPerStep       int64   `json:"model_flops_per_step"`
	ModelTotalPerToken float64 `json:"model_total_flops_per_token"`
	ModelTotalPerStep  int64   `json:"model_total_flops_per_step"`
}

func BuildFlops(cfg *moe.Config, s flops.Shape, ac moe.AC, tile flops.Tile) (*Flops, error) {
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
	rep := &Flops{
		Model: cfg.Name, ModelType: cfg.ModelType, Source: cfg.Source,
		Seq: s.Seq, Batch: s.Batch, Tokens: s.Tokens(), AC: ac, Tile: [2]int{tile.Rows, tile.Cols},
		Params:        FlopsParams{Total: p.Total, Active: p.Active, ByGroup: map[moe.ParamGroup]GroupParams{}},
		FLOPsPerToken: tot.PerToken, FLOPsPerStep: tot.PerStep,
		Conventions: map[flops.Convention]string{}, NonMatmul: nm, NonMatmulFLOPs: nmFLOPs, Layers: layers,
		MTPModules: cfg.MTPLayers,
	}
	for _, g := range moe.Groups() {
		if p.ByGroup[g] > 0 {
			rep.Params.ByGroup[g] = GroupParams{p.ByGroup[g], p.ActiveByGroup[g]}
		}
	}
	for _, c := range flops.AllConventions() {
		rep.Conventions[c] = c.Explain()
	}
	return rep, nil
}

// FmtFLOPs writes a FLOP count in engineering form: 2.791e+10.
func FmtFLOPs(v float64) string { return strconv.FormatFloat(v, 'e', 4, 64) }

// writeFlopsByOp prints the matmul FLOPs of each op summed over layers, by
// pass.
func writeFlopsByOp(w io.Writer, r *Flops) {
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", op, FmtFLOPs(float64(a.f)), FmtFLOPs(float64(a.bd)), FmtFLOPs(float64(a.bw)), FmtFLOPs(float64(a.rec)))
	}
	tw.Flush()
}

// writeFlopsByLayer prints the matmul FLOPs of each layer, runs of
// identical layers on one line.
func writeFlopsByLayer(w io.Writer, r *Flops) {
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", name, x.kind, FmtFLOPs(float64(x.v[0])), FmtFLOPs(float64(x.v[1])), FmtFLOPs(float64(x.v[2])), FmtFLOPs(float64(x.v[3])))
	}
	tw.Flush()
}

func WriteFlops(w io.Writer, r *Flops) error {
	fmt.Fprintf(w, "model %s (%s)\n  source: %s\n", r.Model, r.ModelType, r.Source)
	fmt.Fprintf(w, "step: %d sequence(s) x %d tokens = %s tokens; --ac %s; attention tile %dx%d\n\n",
		r.Batch, r.Seq, FmtInt(r.Tokens), r.AC, r.Tile[0], r.Tile[1])

	fmt.Fprintf(w, "parameters: total %s (%s), active per token %s (%s)\n", FmtInt(r.Params.Total), FmtBillions(r.Params.Total),
		FmtInt(r.Params.Active), FmtBillions(r.Params.Active))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "group\ttotal\tactive\t")
	for _, g := range moe.Groups() {
		if pg, ok := r.Params.ByGroup[g]; ok {
			fmt.Fprintf(tw, "%s\t%s\t%s\t\n", g, FmtInt(pg.Total), FmtInt(pg.Active))
		}
	}
	tw.Flush()
	writeMTP(w, r)

	writeFlopsByOp(w, r)
	writeFlopsByLayer(w, r)

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
		fmt.Fprintf(tw, "%s\t%s elements\t%s FLOPs\t\n", op, FmtInt(r.NonMatmul[op]), FmtInt(r.NonMatmulFLOPs[op]))
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
		line := fmt.Sprintf("%s\t%s\t%s", c, FmtFLOPs(r.FLOPsPerToken[c]), FmtInt(r.FLOPsPerStep[c]))
		if r.MFUByConvention != nil {
			line += fmt.Sprintf("\t%.2f%%", 100*r.MFUByConvention[c])
		}
		fmt.Fprintln(tw, line+"\t"+r.Conventions[c])
	}
	tw.Flush()
	if r.HFU != nil {
		fmt.Fprintf(w, "\nHFU (hardware FLOPs, %s BF16 dense peak %s FLOP/s): %.2f%%\n", r.GPU, FmtFLOPs(r.PeakFLOPs), 100**r.HFU)
	}
	return nil
}

// writeMTP says whether the MTP modules are counted, and their count when
// they are.
func writeMTP(w io.Writer, r *Flops) {
	switch {
	case r.MTP != nil:
		fmt.Fprintf(w, "MTP (--mtp): %d module(s), %s parameters (%s active), not in the figures above; with them, per token: model %s (the modules %s), megatron %s FLOPs\n",
			r.MTP.Modules, FmtInt(r.MTP.ParamsTotal), FmtInt(r.MTP.ParamsActive), FmtFLOPs(r.MTP.ModelTotalPerToken),
			FmtFLOPs(r.MTP.ModelPerToken), FmtFLOPs(r.MTP.MegatronPerToken))
	case r.MTPModules > 0:
		fmt.Fprintf(w, "MTP: %d module(s) (num_nextn_predict_layers) not counted: Hugging Face's model ignores them; --mtp counts them\n", r.MTPModules)
	}
}

// FmtInt writes n with thousands separators: 30,532,122,624.
func FmtInt(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// FmtBillions writes n as 30.53B.
func FmtBillions(n int64) string { return fmt.Sprintf("%.2fB", float64(n)/1e9) }
