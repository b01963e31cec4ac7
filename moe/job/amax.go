package job

import "github.com/moescope/moescope/moe"

// Delayed scaling's state. Each TransformerEngine module under
// DelayedScaling keeps, per GEMM, an FP32 amax history of AmaxHistoryLen
// steps for each of its three forward tensors (input, weight, output) and
// two backward ones (gradient of the output and of the input), beside
// their scales (TransformerEngine d0067d0d
// transformer_engine/pytorch/quantization.py: fp8_meta["scaling_fwd"] and
// ["scaling_bwd"], amax_history of shape (amax_history_len, tensors);
// recipe/__init__.py DelayedScaling, amax_history_len = 1024).

// AmaxHistoryLen is DelayedScaling's default amax_history_len.
const AmaxHistoryLen = 1024

// AmaxForward and AmaxBackward are the tensors with an amax history per
// GEMM in forward and in backward.
const (
	AmaxForward  = 3
	AmaxBackward = 2
)

// DelayedGEMMs counts the GEMMs with delayed-scaling state (fp8-delayed;
// 0 under any other recipe) in the blocks layers of cfg under layout l, as
// Megatron-Core's TE layer spec builds them: per block, attention's fused
// linear_qkv and linear_proj (MLA: its down and up projections, with
// linear_q_proj when queries have no latent, and linear_proj) when the
// linear set is converted; a dense block's fc1 (gate and up fused) and
// fc2, a MoE block's shared experts' fc1 and fc2 likewise; with the
// experts set, the routed experts' grouped fc1 and fc2, one GEMM per local
// expert each. The output layer is not a TE module; indices outside the
// blocks (embedding, head) count nothing.
func (r Recipe) DelayedGEMMs(cfg *moe.Config, l Layout, layers []int) int64 {
	if r.Precision != FP8Delayed {
		return 0
	}
	linear, experts := r.Converts(QuantLinear), r.Converts(QuantExperts)
	var n int64
	for _, i := range layers {
		if i < 0 || i >= cfg.Layers {
			continue
		}
		isMoE := i < len(cfg.MoELayer) && cfg.MoELayer[i]
		if linear {
			n += attentionGEMMs(cfg)
			if !isMoE || cfg.SharedExperts > 0 {
				n += 2
			}
		}
		if experts && isMoE {
			n += 2 * int64(cfg.Experts/max(l.EP, 1))
		}
	}
	return n
}

// attentionGEMMs is a block's attention linears under Megatron-Core's TE
// spec (DelayedGEMMs).
func attentionGEMMs(cfg *moe.Config) int64 {
	if !cfg.IsMLA() {
		return 2
	}
	if cfg.MLA.QRank == 0 {
		return 4 // linear_q_proj, linear_kv_down_proj, linear_kv_up_proj, linear_proj
	}
	return 5
}
