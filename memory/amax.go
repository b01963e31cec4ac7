package memory

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// Amax says which converted GEMM sets keep TransformerEngine's delayed
// scaling state (fp8-delayed); the zero value keeps none.
//
// Each TE module under DelayedScaling keeps, per GEMM, an FP32 amax history
// of AmaxHistoryLen steps for each of its three forward tensors (input,
// weight, output) and two backward ones (gradient of the output and of the
// input), beside their scales (TransformerEngine d0067d0d
// transformer_engine/pytorch/quantization.py: fp8_meta["scaling_fwd"] and
// ["scaling_bwd"], amax_history of shape (amax_history_len, tensors);
// recipe/__init__.py DelayedScaling, amax_history_len = 1024). They live
// as long as the model: one setup allocation.
type Amax struct{ Linear, Experts bool }

// AmaxHistoryLen is DelayedScaling's default amax_history_len.
const AmaxHistoryLen = 1024

// amaxTensorsPerGEMM is the tensors with an amax history per GEMM: three
// forward, two backward.
const amaxTensorsPerGEMM = 5

// GEMMs counts the GEMMs with delayed-scaling state on a rank holding
// units under layout l, as Megatron-Core's TE layer spec builds them: per
// block, attention's fused linear_qkv and linear_proj (MLA: its down and
// up projections, with linear_q_proj when queries have no latent, and
// linear_proj); a dense block's fc1 (gate and up fused) and fc2; a MoE
// block's shared experts' fc1 and fc2 and the routed experts' grouped fc1
// and fc2, one GEMM per local expert each. The output layer is not a TE
// module.
func (a Amax) GEMMs(cfg *moe.Config, l job.Layout, units []Unit) int64 {
	var n int64
	for _, u := range units {
		if u.Layer < 0 || u.Layer >= cfg.Layers {
			continue
		}
		if a.Linear {
			n += attentionGEMMs(cfg)
			switch {
			case u.Layer >= len(cfg.MoELayer) || !cfg.MoELayer[u.Layer]:
				n += 2
			case cfg.SharedExperts > 0:
				n += 2
			}
		}
		if a.Experts && u.Layer < len(cfg.MoELayer) && cfg.MoELayer[u.Layer] {
			n += 2 * int64(cfg.Experts/max(l.EP, 1))
		}
	}
	return n
}

// attentionGEMMs is a block's attention linears under Megatron-Core's TE
// spec (Amax.GEMMs).
func attentionGEMMs(cfg *moe.Config) int64 {
	if !cfg.IsMLA() {
		return 2
	}
	if cfg.MLA.QRank == 0 {
		return 4 // linear_q_proj, linear_kv_down_proj, linear_kv_up_proj, linear_proj
	}
	return 5
}

// HistoryBytes is the rank's amax histories: GEMMs × 5 tensors ×
// AmaxHistoryLen FP32 values.
func (a Amax) HistoryBytes(cfg *moe.Config, l job.Layout, units []Unit) int64 {
	return a.GEMMs(cfg, l, units) * amaxTensorsPerGEMM * AmaxHistoryLen * 4
}

// withHistories inserts the amax histories into a step's events, in setup
// after the parameters (TE allocates them when a module is built); events
// unchanged when a keeps none.
func (a Amax) withHistories(cfg *moe.Config, l job.Layout, units []Unit, events []Event) []Event {
	bytes := a.HistoryBytes(cfg, l, units)
	if bytes == 0 {
		return events
	}
	k := 0
	for k < len(events) && events[k].Phase == Setup && events[k].Category == CatParams {
		k++
	}
	out := make([]Event, 0, len(events)+1)
	out = append(out, events[:k]...)
	out = append(out, Event{Phase: Setup, Micro: -1, Layer: moe.LayerEmbed, Label: "amax_history", Alloc: true,
		Bytes: bytes, Category: CatParams, Stream: ComputeStream})
	return append(out, events[k:]...)
}
