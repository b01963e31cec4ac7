package memory

import "github.com/moescope/moescope/moe"

// tpPlacement is how tensor parallelism with sequence parallelism places a
// saved activation on a tp rank (torchtitan v0.2.2's plan:
// models/qwen3/infra/parallelize.py apply_non_moe_tp,
// models/llama4/infra/parallelize.py apply_moe_ep_tp).
type tpPlacement uint8

const (
	// tpWhole: every tp rank holds all T tokens and all features: what the
	// all-gather out of the sequence-parallel region produces (the inputs
	// of the column-parallel linears and of the router), the replicated
	// router's outputs, the partial sums of the row-parallel linears
	// before their reduce-scatter, ids and labels.
	tpWhole tpPlacement = iota
	// tpSeq: the sequence-parallel region, T/tp tokens (the norms, the
	// block input).
	tpSeq
	// tpFeature: all T tokens, 1/tp of the heads or FFN width (between a
	// column-parallel and a row-parallel linear).
	tpFeature
	// tpVocab: all T tokens, ⌈V/tp⌉ of the vocabulary (loss parallel).
	tpVocab
	// tpExpertRows: the routed (token, expert) rows, split over tp when EP
	// borrows the tp ranks (Layout.TokensPerExpertRank).
	tpExpertRows
	// tpExpertWidth: routed rows of expert FFN width, split by
	// TokensPerExpertRank and by the expert TP degree.
	tpExpertWidth
)

// tpPlace returns the placement of the tensor op saves.
func tpPlace(op moe.Op, tensor moe.Saved) tpPlacement {
	switch op {
	case moe.OpAttnNorm, moe.OpFFNNorm, moe.OpFinalNorm:
		return tpSeq
	case moe.OpQNorm, moe.OpKNorm, moe.OpAttn, moe.OpDenseAct, moe.OpSharedAct:
		return tpFeature
	case moe.OpQProj, moe.OpKProj, moe.OpVProj, moe.OpDenseGate, moe.OpDenseUp, moe.OpSharedGate, moe.OpSharedUp:
		if tensor == moe.SavedOutput {
			return tpFeature
		}
	case moe.OpDenseDown, moe.OpSharedDown, moe.OpOProj:
		if tensor == moe.SavedInput || tensor == moe.SavedScales {
			return tpFeature
		}
	case moe.OpLoss:
		if tensor == moe.SavedLogProbs || tensor == moe.SavedLogits {
			return tpVocab
		}
	case moe.OpExpertGate, moe.OpCombine:
		return tpExpertRows
	case moe.OpDispatch:
		if tensor == moe.SavedOrder || tensor == moe.SavedAllToAllOutput {
			return tpExpertRows
		}
	case moe.OpExpertAct, moe.OpExpertDown:
		return tpExpertWidth
	}
	return tpWhole
}

// tpSaved is rs (layer's saved tensors for T tokens under sh without
// tensor parallelism) as one tp rank keeps them under sh.TP > 1: each
// record divided as tpPlace says, and under the selective policy the two
// reduce-scatter outputs of each block that torchtitan's per-op SAC list
// saves (torch.ops._c10d_functional.reduce_scatter_tensor, v0.2.2
// models/qwen3/infra/parallelize.py _op_sac_save_list: after o_proj and
// after the FFN or MoE, T/tp × D each; the all-gathers are not in the list
// and are recomputed). Tokens T divide by tp (Layout.CheckSeq), the heads
// and FFN widths too (Layout.CheckModel), so every division is exact but
// the vocabulary's.
func tpSaved(cfg *moe.Config, layer int, sh Shape, rs []moe.SavedRecord) []moe.SavedRecord {
	tp := int64(sh.TP)
	if tp <= 1 {
		return rs
	}
	T := int64(sh.Batch) * int64(sh.Seq)
	rows, width := int64(max(sh.ExpertRows, 1)), int64(max(sh.ExpertTP, 1))
	out := make([]moe.SavedRecord, 0, len(rs)+2)
	for _, r := range rs {
		place := tpPlace(r.Op, r.Tensor)
		if sh.TE.Blocks && teSavesLocal(r) {
			place = tpSeq
		}
		switch place {
		case tpSeq, tpFeature:
			r.Elements /= tp
		case tpVocab:
			r.Elements = T * chunk(int64(cfg.Vocab), tp)
		case tpExpertRows:
			r.Elements /= rows
		case tpExpertWidth:
			r.Elements /= rows * width
		}
		out = append(out, r)
	}
	if layer >= 0 && layer < cfg.Layers && sh.AC.Mode == moe.ACSelective && !sh.AC.FullyCheckpointed(layer) {
		n := T / tp * int64(cfg.Hidden)
		ffn := moe.OpDenseDown
		if cfg.MoELayer[layer] {
			ffn = moe.OpCombine
		}
		out = append(out,
			moe.SavedRecord{Layer: layer, Op: moe.OpOProj, Tensor: moe.SavedTPReduceScatterOutput, Elements: n, DType: sh.Act},
			moe.SavedRecord{Layer: layer, Op: ffn, Tensor: moe.SavedTPReduceScatterOutput, Elements: n, DType: sh.Act})
	}
	return out
}
