package hf

import (
	"fmt"

	"github.com/moescope/moescope/moe"
)

// The FFN's keys: the dense layers' width and, for the MoE types, experts,
// routing, the aux loss and which layers are MoE (deepseek.go reads the
// DeepSeek-V2/V3 family's routing).

// denseFFN fills the dense layers' FFN width: every type but mixtral and
// olmoe (whose intermediate_size is the expert width) reads
// intermediate_size.
func (h *configJSON) denseFFN(c *moe.Config, e *hfErrors) {
	switch h.ModelType {
	case "mixtral", "olmoe", "gpt_oss", "llama4", "llama4_text":
	default:
		c.DenseFFN = e.req("intermediate_size", h.IntermediateSize)
	}
}

// experts fills experts, routing, the aux loss and the MoE/dense layer pattern.
func (h *configJSON) experts(c *moe.Config, def hfDefault, layersOK bool, e *hfErrors) {
	c.NormTopK = opt(h.NormTopKProb, def.normTopK)
	c.AuxLossCoef = opt(h.RouterAuxLossCoef, def.auxCoef)
	c.OutputRouterLogits = opt(h.OutputRouterLogits, false)
	c.TopK = e.req("num_experts_per_tok", h.NumExpertsPerTok)
	isMoE := func(int) bool { return true }
	switch h.ModelType {
	case "qwen3_moe", "qwen2_moe":
		isMoE = h.moeQwen(c, layersOK, e)
	case "mixtral":
		c.Experts = e.req("num_local_experts", h.NumLocalExperts)
		c.ExpertFFN = e.req("intermediate_size", h.IntermediateSize)
		c.NormTopK = true // softmax over the top-k logits is the renormalized top-k
		// MixtralDecoderLayer.block_sparse_moe holds MixtralBlockSparseTop2MLP
		// experts with w2(silu(w1(x))·w3(x)) (modeling_mixtral.py,
		// transformers commit 00d4b3d2).
		c.Names = moe.TensorNames{MoE: "block_sparse_moe", ExpertGate: "w1", ExpertUp: "w3", ExpertDown: "w2"}
	case "olmoe":
		c.Experts = e.req("num_experts", h.NumExperts)
		c.ExpertFFN = e.req("intermediate_size", h.IntermediateSize)
	case "deepseek":
		isMoE = h.moeDeepseek(c, def, e)
	case "glm4_moe":
		isMoE = h.moeGLM(c, def, e)
	case "deepseek_v3", "kimi_k2", "deepseek_v2":
		isMoE = h.moeDeepseekMLA(c, def, e)
	case "gpt_oss":
		isMoE = h.moeGPTOSS(c, e)
	case "llama4", "llama4_text":
		isMoE = h.moeLlama4(c, layersOK, e)
	}
	if layersOK {
		for i := range c.MoELayer {
			c.MoELayer[i] = isMoE(i)
		}
	}
	if c.MoELayers() == c.Layers && (h.ModelType == "mixtral" || h.ModelType == "olmoe") {
		c.DenseFFN = 0
	}
}

// moeQwen fills Qwen3-MoE's and Qwen2-MoE's experts; the result says which
// layers are MoE.
func (h *configJSON) moeQwen(c *moe.Config, layersOK bool, e *hfErrors) func(int) bool {
	// Qwen*MoeDecoderLayer: MoE when the layer is not in mlp_only_layers
	// and num_experts > 0 and (i+1) % decoder_sparse_step == 0.
	c.Experts = e.req("num_experts", h.NumExperts)
	c.ExpertFFN = e.req("moe_intermediate_size", h.MoEIntermediateSize)
	step := opt(h.DecoderSparseStep, 1)
	if step <= 0 {
		e.unsupported("decoder_sparse_step", step, "must be ≥ 1")
		step = 1
	}
	dense := map[int]bool{}
	for _, i := range h.MLPOnlyLayers {
		if i < 0 || (layersOK && i >= c.Layers) {
			e.unsupported("mlp_only_layers", i, fmt.Sprintf("layer index must be in [0, %d)", c.Layers))
		}
		dense[i] = true
	}
	if h.ModelType == "qwen2_moe" {
		// One shared expert of shared_expert_intermediate_size, scaled by
		// σ(x·w_g) (Qwen2MoeSparseMoeBlock.shared_expert_gate).
		if s := e.req("shared_expert_intermediate_size", h.SharedIntermediate); s > 0 {
			c.SharedExperts, c.SharedFFN, c.SharedGated = 1, s, true
		}
		// Qwen2MoeSparseMoeBlock.shared_expert (singular; modeling_qwen2_moe.py,
		// transformers commit 1c351314).
		c.Names.Shared = "shared_expert"
	}
	return func(i int) bool { return !dense[i] && c.Experts > 0 && (i+1)%step == 0 }
}

// moeDeepseek fills DeepSeek-MoE's experts, routing and aux loss; the
// result says which layers are MoE.
func (h *configJSON) moeDeepseek(c *moe.Config, def hfDefault, e *hfErrors) func(int) bool {
	// modeling_deepseek.py: DeepseekMoE when n_routed_experts is set and
	// i ≥ first_k_dense_replace and i % moe_layer_freq == 0; shared
	// experts are one DeepseekMLP of moe_intermediate_size·n_shared_experts.
	// Its MoEGate renormalizes the top-k weights only when top_k > 1,
	// adding 1e-20 to their sum, and adds aux_loss_alpha·aux whenever
	// training, per sequence when seq_aux (the default).
	c.Experts = e.req("n_routed_experts", h.NRoutedExperts)
	c.ExpertFFN = e.req("moe_intermediate_size", h.MoEIntermediateSize)
	if s := opt(h.NSharedExperts, 0); s > 0 {
		c.SharedExperts, c.SharedFFN = s, c.ExpertFFN
	}
	if sf := h.ScoringFunc; sf != nil && *sf != "softmax" {
		e.unsupported("scoring_func", *sf, `DeepSeek-MoE's MoEGate implements only "softmax"`)
	}
	c.NormTopK = c.NormTopK && c.TopK > 1
	c.NormTopKEps = 1e-20
	c.AuxLossCoef = opt(h.AuxLossAlpha, def.auxCoef)
	c.OutputRouterLogits = c.AuxLossCoef > 0
	c.SeqAuxLoss = true
	if !opt(h.SeqAux, true) && c.AuxLossCoef > 0 {
		e.unsupported("seq_aux", false, "MoEGate's batch-level aux loss is not modelled; with aux_loss_alpha > 0 only seq_aux = true is")
	}
	first := opt(h.FirstKDenseReplace, def.firstKDense)
	freq := opt(h.MoELayerFreq, 1)
	if freq <= 0 {
		e.unsupported("moe_layer_freq", freq, "must be ≥ 1")
		freq = 1
	}
	return func(i int) bool { return i >= first && i%freq == 0 }
}

// moeGLM fills GLM-4.5's experts and routing; the result says which layers
// are MoE.
func (h *configJSON) moeGLM(c *moe.Config, def hfDefault, e *hfErrors) func(int) bool {
	// Glm4MoeDecoderLayer: MoE from first_k_dense_replace on; a sigmoid
	// Glm4MoeTopkRouter with e_score_correction_bias, grouped top-k and
	// routed_scaling_factor; shared experts as one MLP of
	// moe_intermediate_size·n_shared_experts.
	c.Experts = e.req("n_routed_experts", h.NRoutedExperts)
	c.ExpertFFN = e.req("moe_intermediate_size", h.MoEIntermediateSize)
	if s := opt(h.NSharedExperts, 1); s > 0 {
		c.SharedExperts, c.SharedFFN = s, c.ExpertFFN
	}
	c.Score, c.SelectionBias = moe.Sigmoid, true
	c.NormTopKEps = 1e-20      // Glm4MoeMoE.route_tokens_to_experts
	c.IgnoreExtraLayers = true // the MTP block (skippedByHF in weights.go)
	c.RoutedScale = opt(h.RoutedScalingFactor, 1)
	c.Groups = opt(h.NGroup, 1)
	c.TopKGroups = opt(h.TopKGroup, 1)
	c.AuxLossCoef = opt(h.RouterAuxLossCoef, 0)
	first := opt(h.FirstKDenseReplace, def.firstKDense)
	return func(i int) bool { return i >= first }
}
