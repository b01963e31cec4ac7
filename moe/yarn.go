package moe

// Yarn is YaRN's RoPE scaling (Peng et al. 2023, arXiv:2309.00071) as
// transformers computes it in modeling_rope_utils.py
// _compute_yarn_parameters (commit 26892c16, read in the zucchini-nlp fork
// of huggingface/transformers) and every model type here applies it: the
// inverse frequencies are a per-dimension blend of the plain ones
// (extrapolation) and the plain ones ÷ Factor (interpolation), and cos and
// sin are multiplied by AttentionFactor. With h = r/2 rotated pairs and
// plain frequencies f_i = θ^(−2i/r), i < h:
//
//	dim(β)  = r·ln(OriginalMaxPositions / (2π·β)) / (2·ln θ)
//	lo, hi  = dim(BetaFast), dim(BetaSlow), floored and ceiled when
//	          Truncate, then clamped to lo ≥ 0, hi ≤ r − 1 (hi += 0.001
//	          when lo = hi)
//	ramp_i  = clamp((i − lo)/(hi − lo), 0, 1)
//	inv_i   = f_i/Factor · ramp_i + f_i · (1 − ramp_i)
//
// so the fast-rotating dimensions keep their frequency and the slow ones
// are interpolated. DeepSeek-V3's attention also multiplies its softmax
// scale by m(factor, mscale_all_dim)² (DeepseekV3Attention.__init__ in
// modeling_deepseek_v3.py, transformers f5a9ec51; Config.AttnScale, set by
// moe/hf), a separate factor.
type Yarn struct {
	Factor float64 `json:"factor"`
	// OriginalMaxPositions is original_max_position_embeddings, the
	// pre-extension context length the correction range is measured at.
	OriginalMaxPositions int     `json:"original_max_position_embeddings"`
	BetaFast             float64 `json:"beta_fast"`
	BetaSlow             float64 `json:"beta_slow"`
	Truncate             bool    `json:"truncate"`
	// AttentionFactor multiplies cos and sin, so q·k of the rotated dims
	// by its square: attention_factor, or from mscale and mscale_all_dim
	// (moe/hf).
	AttentionFactor float64 `json:"attention_factor"`
}
