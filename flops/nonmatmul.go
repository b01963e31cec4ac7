package flops

import "github.com/moescope/moescope/moe"

// ElementCost is moescope's count of the floating-point operations one
// element of an elementwise op performs in a pass, counting every add,
// subtract, multiply, divide, max and exp as one FLOP. No framework
// publishes such costs for backward passes (DeepSpeed's flops profiler
// estimates forward only: 5 per element for an affine norm, 1 for softmax
// and activations), so each is derived below from the op's formula, per
// element of the Count that moe/ops.go defines:
//
//	op                 forward                          backward_data                         backward_weight
//	RMSNorm (all 7)    x² 1, sum 1, ·rstd 1, ·w 1 = 4     g·w, ·x̂, sum, x̂·m, −, ·rstd = 6         x̂ = x·rstd 1, g·x̂ 1, sum 1 = 3
//	q/k L2 (l2_rope)   x² 1, sum 1, ·rstd 1 = 3           ·x̂, sum, x̂·m, −, ·rstd = 5             — (no weight)
//	embed              gather 0                          —                                     scatter-add 1
//	rope               x·cos + rot(x)·sin = 3            the same with −sin = 3                 —
//	residual           add 1                             —                                     —
//	router_topk        softmax: max, −, exp, sum, ÷ = 5   p·(g − Σ g·p): ·, sum, −, · = 4         —
//	                   sigmoid: exp, +1, ÷ = 3            g·σ·(1−σ): −, ·, · = 3
//	dispatch           copy 0                            copy 0                                —
//	*_act (SwiGLU)     σ 3, g·σ 1, ·u 1 = 5               σ 3, dsilu 4, du 2, dg 2 = 11          —
//	expert_act clamped min 1, clamp 2, α· 1, σ 3, g·σ 1,   clamps 3, α· 1, σ 3, g·σ 1, du 1,       —
//	 (Config.Clamp)    u+1 1, · 1 = 10                    u+1 1, dglu 1, dsilu_α 5, masks 2 = 18
//	combine            ·w, + = 2                         dy = w·g 1, dw = Σ g·y 2 = 3           —
//	 (route_input: the ·w moves to the expert's input row; the counts stay)
//	shared_scale       · 1                               dy 1, dgate Σ 2 = 3                    —
//	loss               max, −, exp, sum, − = 5            softmax exp 1, ·scale 1 = 2            —
//	aux_loss           mask 1, sum 1 = 2                  1                                     —
//
// (σ = exp, +1, ÷; dsilu = σ·(1 + g·(1−σ)): −, ·, +, ·; dsilu_α = σ·(1 +
// α·g·(1−σ)): −, ·, ·, +, ·. The clamped form (moe/swiglu.go) recomputes its
// clamps and σ(α·g) in backward and masks both gradients.) Recompute repeats
// forward. Per-row scalars (rstd's rsqrt, the log of the softmax sum, the
// top-k comparisons) are not counted: they are O(T), not O(elements).
// Llama 4's temperature tuning (one multiply per query element of a NoPE
// layer, moe/llama4.go) has no op of its own yet and is not counted here.
func ElementCost(cfg *moe.Config, op moe.Op, pass moe.Pass) int64 {
	if pass == moe.Recompute {
		pass = moe.Forward
	}
	type costs [3]int64 // forward, backward_data, backward_weight
	var c costs
	switch op {
	case moe.OpAttnNorm, moe.OpFFNNorm, moe.OpFinalNorm, moe.OpQNorm, moe.OpKNorm, moe.OpQANorm, moe.OpKVANorm:
		c = costs{4, 6, 3}
		if (op == moe.OpQNorm || op == moe.OpKNorm) && cfg.QKNorm == moe.QKNormL2Rope {
			c = costs{3, 5, 0}
		}
	case moe.OpEmbed:
		c = costs{0, 0, 1}
	case moe.OpRoPE:
		c = costs{3, 3, 0}
	case moe.OpResidual:
		c = costs{1, 0, 0}
	case moe.OpRouterTopK:
		c = costs{5, 4, 0}
		if cfg.Score == moe.Sigmoid {
			c = costs{3, 3, 0}
		}
	case moe.OpExpertAct, moe.OpSharedAct, moe.OpDenseAct:
		c = costs{5, 11, 0}
		if op == moe.OpExpertAct && cfg.Clamp != nil {
			c = costs{10, 18, 0}
		}
	case moe.OpCombine, moe.OpSharedScale:
		c = costs{2, 3, 0}
		if op == moe.OpSharedScale {
			c[0] = 1
		}
	case moe.OpLoss:
		c = costs{5, 2, 0}
	case moe.OpAuxLoss:
		c = costs{2, 1, 0}
	}
	if int(pass) < len(c) {
		return c[pass]
	}
	return 0
}

// NonMatmulFLOPs sums, per elementwise op over every layer and pass, the
// records' Count × ElementCost: the work every convention of this package
// leaves out, under moescope's per-element costs. Overflow is an error.
func NonMatmulFLOPs(cfg *moe.Config, recs []moe.OpRecord) (map[moe.Op]int64, error) {
	var c checked
	m := map[moe.Op]int64{}
	for _, r := range recs {
		if r.Op.Kind() == moe.KindElementwise {
			m[r.Op] = c.add(m[r.Op], c.mul(r.Count, ElementCost(cfg, r.Op, r.Pass)))
		}
	}
	return m, c.err
}
