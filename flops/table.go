package flops

import (
	"github.com/moescope/moescope/moe"
)

// OpRow is one op of one layer across the four passes. Matmul, grouped and
// attention ops are in FLOPs (2 per multiply-add, Unit "flops"); elementwise
// ops in elements processed (Unit "elements"), the non-matmul work that no
// convention counts.
type OpRow struct {
	Op             moe.Op `json:"op"`
	Unit           string `json:"unit"`
	Forward        int64  `json:"forward"`
	BackwardData   int64  `json:"backward_data"`
	BackwardWeight int64  `json:"backward_weight"`
	Recompute      int64  `json:"recompute"`
}

// Total is the sum over the four passes.
func (r OpRow) Total() int64 { return r.Forward + r.BackwardData + r.BackwardWeight + r.Recompute }

// LayerRow holds the ops of one layer in forward order. Kind is "embed",
// "dense", "moe" or "head"; Layer is moe.LayerEmbed for the embedding and
// cfg.LayerHead() for final norm, LM head and loss.
type LayerRow struct {
	Layer int     `json:"layer"`
	Kind  string  `json:"kind"`
	Ops   []OpRow `json:"ops"`
}

// MatmulFLOPs sums the FLOPs ops of the row over all passes.
func (l LayerRow) MatmulFLOPs() (fwd, bd, bw, rec int64) {
	for _, o := range l.Ops {
		if o.Unit == "flops" {
			fwd += o.Forward
			bd += o.BackwardData
			bw += o.BackwardWeight
			rec += o.Recompute
		}
	}
	return
}

// Layers groups an Ops table by layer and op, converting matmul-kind counts
// to FLOPs (overflow-checked).
func Layers(cfg *moe.Config, recs []moe.OpRecord) ([]LayerRow, error) {
	var c checked
	var rows []LayerRow
	rowOf := map[int]int{}
	type key struct {
		l  int
		op moe.Op
	}
	opOf := map[key]int{}
	for _, r := range recs {
		ri, ok := rowOf[r.Layer]
		if !ok {
			kind := "head"
			switch {
			case r.Layer == moe.LayerEmbed:
				kind = "embed"
			case r.Layer >= 0 && r.Layer < cfg.Layers && cfg.MoELayer[r.Layer]:
				kind = "moe"
			case r.Layer >= 0 && r.Layer < cfg.Layers:
				kind = "dense"
			}
			ri = len(rows)
			rowOf[r.Layer] = ri
			rows = append(rows, LayerRow{Layer: r.Layer, Kind: kind})
		}
		k := key{r.Layer, r.Op}
		oi, ok := opOf[k]
		if !ok {
			unit := "flops"
			if r.Op.Kind() == moe.KindElementwise {
				unit = "elements"
			}
			oi = len(rows[ri].Ops)
			opOf[k] = oi
			rows[ri].Ops = append(rows[ri].Ops, OpRow{Op: r.Op, Unit: unit})
		}
		o := &rows[ri].Ops[oi]
		v := r.Count
		if o.Unit == "flops" {
			v = c.mul(2, v)
		}
		switch r.Pass {
		case moe.Forward:
			o.Forward = c.add(o.Forward, v)
		case moe.BackwardData:
			o.BackwardData = c.add(o.BackwardData, v)
		case moe.BackwardWeight:
			o.BackwardWeight = c.add(o.BackwardWeight, v)
		case moe.Recompute:
			o.Recompute = c.add(o.Recompute, v)
		}
	}
	if c.err != nil {
		return nil, c.err
	}
	return rows, nil
}

// NonMatmul sums, per elementwise op over every layer and pass, the
// elements processed (norms, RoPE, activations, router top-k, dispatch and
// combine, residual adds, loss): the work the FLOP conventions leave out.
func NonMatmul(recs []moe.OpRecord) (map[moe.Op]int64, error) {
	var c checked
	m := map[moe.Op]int64{}
	for _, r := range recs {
		if r.Op.Kind() == moe.KindElementwise {
			m[r.Op] = c.add(m[r.Op], r.Count)
		}
	}
	return m, c.err
}
