package ref

import "github.com/moescope/moescope/moe"

// Load-balancing auxiliary losses, computed from the router scores s and
// selections of every MoE layer of one micro-batch (B sequences of S tokens,
// T = B·S, E experts, K slots):
//
// Hugging Face's load_balancing_loss_func (Qwen2/3-MoE, Mixtral, OLMoE)
// concatenates the layers: with N = L_moe·T rows, f_{k,e} = (1/N)·#{rows
// whose slot k picked e} and P_e = (1/N)·Σ_rows s_{row,e},
//
//	aux = E·Σ_{k,e} f_{k,e}·P_e = E/N²·Σ_e c_e·Σ_rows s_{row,e},  ∂aux/∂s_{l,t,e} = E·c_e/N²
//
// where c_e counts e over all layers, tokens and slots (the attention-mask
// branch does not apply: there is no padding). With Config.SeqAuxLoss,
// DeepSeek-MoE's MoEGate (modeling_deepseek.py, seq_aux = True, its
// configuration's default) adds one loss per layer, per sequence b:
//
//	ce_{b,e} = c_{b,e}·E/(S·K),  aux_l = (1/B)·Σ_b Σ_e ce_{b,e}·(1/S)·Σ_{t∈b} s_{t,e}
//	∂aux_l/∂s_{t,e} = ce_{b,e}/(B·S) for t in sequence b
//
// and aux = Σ_l aux_l; its gradient reaches the router through
// AddAuxiliaryLoss while the reported loss stays the cross-entropy. The
// selections counted are the router's own (HF's function re-runs top-k on
// softmax scores, the same selection for ungrouped softmax routers, the
// only ones it is defined for).

// AuxLoss returns the aux loss of a micro-batch from the blocks' last
// forward (run with a non-zero Options.AuxCoef) and, per layer (nil for
// dense layers), coef·∂aux/∂s as Block.Backward takes it.
func AuxLoss[T Float](c *moe.Config, blocks []*Block[T], coef float64) (aux float64, grad [][]T) {
	E := c.Experts
	grad = make([][]T, len(blocks))
	if len(blocks) == 0 {
		return 0, grad
	}
	B, S := blocks[0].batch, blocks[0].seq
	if c.SeqAuxLoss {
		for l, b := range blocks {
			if b.seqCounts == nil {
				continue
			}
			grad[l] = make([]T, B*E)
			for i, n := range b.seqCounts {
				ce := float64(n) * float64(E) / float64(S*c.TopK)
				aux += ce * float64(b.seqScores[i]) / float64(S) / float64(B)
				grad[l][i] = T(coef * ce / float64(B*S))
			}
		}
		return aux, grad
	}
	cnt, sum := make([]float64, E), make([]float64, E)
	AuxPartial(blocks, cnt, sum)
	aux, g := AuxFromTotals[T](c, B, S, cnt, sum, coef)
	for l, b := range blocks {
		if b.seqCounts != nil {
			grad[l] = g
		}
	}
	return aux, grad
}

// AuxPartial adds to cnt and sum [E] the counts c_e and score sums
// Σ_rows s_{row,e} of the MoE layers among blocks (their last forward), in
// block order: HF's aux loss needs them over every layer, so a pipeline
// stage adds its layers' to the running totals its predecessor sent, which
// sums them in one rank's order.
func AuxPartial[T Float](blocks []*Block[T], cnt, sum []float64) {
	E := len(cnt)
	for _, b := range blocks {
		for i, n := range b.seqCounts {
			cnt[i%E] += float64(n)
			sum[i%E] += float64(b.seqScores[i])
		}
	}
}

// AuxFromTotals is HF's aux loss of a micro-batch of B sequences of S
// tokens from the totals over every MoE layer (AuxPartial), with coef·
// ∂aux/∂s [B·E], the same for every MoE layer.
func AuxFromTotals[T Float](c *moe.Config, B, S int, cnt, sum []float64, coef float64) (aux float64, g []T) {
	E := c.Experts
	N := float64(c.MoELayers() * B * S)
	g = make([]T, B*E)
	for e := 0; e < E; e++ {
		aux += float64(E) * cnt[e] * sum[e] / (N * N)
		for sq := 0; sq < B; sq++ {
			g[sq*E+e] = T(coef * float64(E) * cnt[e] / (N * N))
		}
	}
	return aux, g
}
