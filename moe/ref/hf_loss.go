package ref

import "github.com/moescope/moescope/moe"

// The loss Hugging Face trains on, given input_ids = labels = tokens (the
// model shifts the labels itself): the mean cross-entropy of predicting
// tokens[:, 1:], plus coef·aux where the model's training code adds an aux
// loss, with the aux loss over the routing of every token, the last one
// included. ForwardBackward instead takes torchtitan's convention, s+1 ids
// of which the first s are inputs, so the last token is never routed.

// HFAuxCoef is the coefficient of the aux loss in the loss HF trains on
// (DESIGN.md, "Losses"): Config.AuxLossCoef when OutputRouterLogits is set
// on a model with softmax-routed MoE layers, else 0. Qwen*MoeForCausalLM,
// MixtralForCausalLM and OlmoeForCausalLM add
// router_aux_loss_coef·load_balancing_loss_func only with
// output_router_logits; Glm4MoeForCausalLM (the sigmoid router) has no aux
// loss; DeepSeek-MoE's MoEGate adds aux_loss_alpha times its per-sequence
// loss (Config.SeqAuxLoss) whenever training, which hf.ParseConfig records as
// OutputRouterLogits = aux_loss_alpha > 0.
func HFAuxCoef(c *moe.Config) float64 {
	if !c.OutputRouterLogits || !c.IsMoE() || c.Score != moe.Softmax {
		return 0
	}
	return c.AuxLossCoef
}

// ForwardBackwardHF runs one micro-batch under HF's convention:
// tokens[i] holds s ≥ 2 ids, all of them inputs, the labels being the next
// ids. It accumulates scale·∂(Loss + o.AuxCoef·Aux)/∂θ into Grad (pass
// o.AuxCoef = HFAuxCoef(m.Cfg) for the loss HF trains on) and returns the
// losses, Aux computed over all s tokens of each sequence.
//
// The cross-entropy does not depend on the last input token (causal
// attention, per-token routing and FFN), so without the aux loss one
// ForwardBackward on tokens is exact. With it, ext = tokens plus one
// arbitrary label id per sequence makes every token an input, and as
// gradients are linear
//
//	∇(CE + coef·aux) = ∇CE(tokens) + ∇(CE(ext) + coef·aux(ext)) − ∇CE(ext)
//
// three passes instead of one. Load accumulates the routing of every pass
// run (it serves torchtitan's selection-bias update, which uses
// ForwardBackward).
func (m *Model[T]) ForwardBackwardHF(tokens [][]int, scale float64, o Options) (Result, error) {
	coef := o.AuxCoef
	ce := o
	ce.AuxCoef = 0
	res, err := m.ForwardBackward(tokens, scale, ce)
	if err != nil || coef == 0 {
		return res, err
	}
	ext := make([][]int, len(tokens))
	for i, s := range tokens {
		ext[i] = append(append(make([]int, 0, len(s)+1), s...), 0)
	}
	withAux, err := m.ForwardBackward(ext, scale, o)
	if err != nil {
		return res, err
	}
	if _, err := m.ForwardBackward(ext, -scale, ce); err != nil {
		return res, err
	}
	res.Aux = withAux.Aux
	res.Total = res.Loss + coef*res.Aux
	return res, nil
}
