package moe

// Attention sinks (GPT-OSS): each query head h has a learned logit s_h that
// joins every softmax row, so for query i with unmasked keys j
//
//	p_ij = exp(z_ij) / (exp(s_h) + Σ_j exp(z_ij)),   out_i = Σ_j p_ij·v_j
//
// and the sink's share exp(s_h)/(…) multiplies no value row
// (eager_attention_forward in modeling_gpt_oss.py, transformers 00d4b3d2,
// concatenates the sink to the logits and drops its column after the
// softmax). The sink adds no multiply-add to QKᵀ or PV: the attention op's
// counts (ops.go) do not change with it.

// validateSinks refuses the GPT-OSS attention fields under latent attention,
// whose tensors (mlaParams) have no place for them.
func (c *Config) validateSinks(e *fieldErrors) {
	if !c.IsMLA() {
		return
	}
	if c.AttnSinks {
		e.bad("attn_sinks", true, "not with multi-head latent attention")
	}
	if c.OProjBias {
		e.bad("o_proj_bias", true, "not with multi-head latent attention")
	}
}
