package flops

import (
	"fmt"

	"github.com/moescope/moescope/moe"
)

// Multi-token prediction (DeepSeek-V3, arXiv:2412.19437 §2.2): the
// checkpoint holds cfg.MTPLayers modules after the main model's layers
// (num_nextn_predict_layers). Hugging Face's model ignores them, and so do
// CountParams, Ops and every convention; these functions count them when a
// caller asks (`moescope flops --mtp`).

// MTPParams counts the parameters of cfg's MTP modules as DeepSeek-V3's
// README_WEIGHTS.md lists each one: enorm and hnorm [D], eh_proj [D, 2D],
// one decoder layer shaped as the main model's last, and shared_head.norm
// [D]; the embedding and the output head are the main model's, shared and
// not counted again (the checkpoint stores copies of both, which are not
// counted either). Active counts the module's layer with its top-k experts.
func MTPParams(cfg *moe.Config) (total, active int64, err error) {
	if err := cfg.Validate(); err != nil {
		return 0, 0, err
	}
	if cfg.MTPLayers == 0 {
		return 0, 0, nil
	}
	// The last layer alone, as a one-layer model, minus that model's
	// embedding, final norm and LM head.
	one := lastLayer(cfg)
	p, err := CountParams(&one)
	if err != nil {
		return 0, 0, err
	}
	var c checked
	D := int64(cfg.Hidden)
	outside := c.add(p.ByGroup[moe.GroupEmbedding], p.ByGroup[moe.GroupLMHead], D)
	own := c.add(c.mul(3, D), c.mul(2, D, D)) // enorm, hnorm, shared_head.norm; eh_proj
	M := int64(cfg.MTPLayers)
	total = c.mul(M, c.add(p.Total-outside, own))
	active = c.mul(M, c.add(p.Active-outside, own))
	if c.err != nil {
		return 0, 0, fmt.Errorf("mtp params: %w", c.err)
	}
	return total, active, nil
}

// MegatronMTPPerStep is Megatron-LM's num_floating_point_operations with
// --mtp-num-layers = cfg.MTPLayers (transformer_flops, Megatron-LM
// 001b00c2): MegatronPerStep's count with the MTP layers added as layers
// of the last layer's kind, 6·(3·D + 2·D²) per token and MTP layer for
// their norms and eh_proj, and the logits once more per MTP layer.
func MegatronMTPPerStep(cfg *moe.Config, s Shape, vocabMultiple int) (int64, error) {
	if cfg == nil {
		return 0, fmt.Errorf("flops: nil config")
	}
	return megatron(cfg, s, vocabMultiple, cfg.MTPLayers)
}

// lastLayer is cfg with only its last layer: the shape of an MTP module's
// transformer block.
func lastLayer(cfg *moe.Config) moe.Config {
	one := *cfg
	last := cfg.Layers - 1
	one.Layers, one.MoELayer, one.Window = 1, cfg.MoELayer[last:], cfg.Window[last:]
	if cfg.Chunk != nil {
		one.Chunk = cfg.Chunk[last:]
	}
	if cfg.NoRope != nil {
		one.NoRope = cfg.NoRope[last:]
	}
	return one
}

// MTPModelPerStep is the model-convention count (forward and backward
// matmul FLOPs, no recompute) of cfg's MTP modules over a step of shape s.
// Per module (DeepSeek-V3, arXiv:2412.19437 §2.2: h′ = M·[RMSNorm(h);
// RMSNorm(Emb(t))], one transformer block, the shared output head): eh_proj
// M ∈ R^{D×2D}, 2·2D·D per token forward and twice that backward; a block
// shaped as the main model's last layer with its attention over the
// sequence; and the output head once more. Every token of the sequence
// goes through each module, as Megatron-LM runs them (roll_tensor in
// megatron/core/transformer/multi_token_prediction.py, 13f8f526, shifts the
// inputs and labels by one per module and zero-fills the end) and counts
// them (transformer_flops, 001b00c2); the paper's module k predicts T − k
// tokens. RMSNorms and the embedding lookup are not matmuls and are not
// counted, as in ModelPerStep.
func MTPModelPerStep(cfg *moe.Config, s Shape) (int64, error) {
	if err := checkShape(cfg, s); err != nil {
		return 0, err
	}
	if cfg.MTPLayers == 0 {
		return 0, nil
	}
	one := lastLayer(cfg)
	block, err := ModelPerStep(&one, s) // the block and the LM head
	if err != nil {
		return 0, err
	}
	var c checked
	D := int64(cfg.Hidden)
	n := c.mul(int64(cfg.MTPLayers), c.add(block, c.mul(6, 2, D, D, s.Tokens())))
	if c.err != nil {
		return 0, fmt.Errorf("mtp flops: %w", c.err)
	}
	return n, nil
}
