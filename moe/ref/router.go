package ref

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/kernel"
)

// Routing is the router's decision for T tokens of one MoE layer.
//
// Scores s = softmax(z) (Qwen, Mixtral, OLMoE, DeepSeek-MoE) or σ(z)
// (GLM-4.5, DeepSeek-V3) of the router logits z = x·W_rᵀ [T,E]. Selection
// uses c = s (+ the selection bias b when Config.SelectionBias, which takes
// no gradient). With Groups > 1 the experts are split into Groups equal
// groups; a group's score is the sum of its two best c (sigmoid routers, as
// glm4_moe's Glm4MoeTopkRouter and DeepSeek-V3) or its best c (softmax
// routers, DeepSeek-V2's group_limited_greedy); the TopKGroups best groups
// stay eligible and every other c is set to 0 (HF's masked_fill(…, 0.0)).
// The K largest c give the indices (ties to the lower expert index); the
// weights are the scores at those indices, w_k = s_{i_k}, renormalized when
// Config.NormTopK, w_k ← w_k/(Σ_j w_j + ε) with ε = Config.NormTopKEps,
// then multiplied by Config.RoutedScale.
type Routing[T Float] struct {
	Tokens, Experts, K int
	Scores             []T     // s [T,E]
	Indices            []int32 // [T,K] selected experts
	Weights            []T     // w [T,K]
	// Counts[e] is the number of (token, slot) pairs routed to expert e;
	// Σ Counts = T·K (dropless).
	Counts []int
	// Values [T,K] are the selected scores and Denom [T] their sum + ε,
	// which the renormalization's backward reads (nil without NormTopK).
	Values, Denom []T
	// Order lists the T·K (token, slot) pairs t·K+k in expert order (stable):
	// row r of the dispatched matrix is token Order[r]/K.
	Order []int32
}

func newRouting[T Float](tokens, experts, k int) *Routing[T] {
	return &Routing[T]{Tokens: tokens, Experts: experts, K: k,
		Scores: make([]T, tokens*experts), Indices: make([]int32, tokens*k),
		Weights: make([]T, tokens*k), Counts: make([]int, experts), Order: make([]int32, tokens*k)}
}

// routeScores writes r.Scores from the logits z [T,E].
func routeScores[T Float](c *moe.Config, r *Routing[T], z []T) {
	E := r.Experts
	kernel.ParallelFor(r.Tokens, 4*E, func(lo, hi int) { routeScoresRows(c, r, z, lo, hi) })
}

// routeScoresRows is routeScores on tokens [lo, hi).
func routeScoresRows[T Float](c *moe.Config, r *Routing[T], z []T, lo, hi int) {
	E := r.Experts
	for t := lo; t < hi; t++ {
		zt, st := z[t*E:t*E+E], r.Scores[t*E:t*E+E]
		if c.Score == moe.Sigmoid {
			for e, v := range zt {
				st[e] = sigmoid(v)
			}
			continue
		}
		mx := zt[0]
		for _, v := range zt {
			mx = max(mx, v)
		}
		var sum T
		for e, v := range zt {
			st[e] = exp(v - mx)
			sum += st[e]
		}
		for e := range st {
			st[e] /= sum
		}
	}
}

// routeSelect fills Indices from the scores and the selection bias (nil when none).
func routeSelect[T Float](c *moe.Config, r *Routing[T], bias []T) {
	E, K := r.Experts, r.K
	choice := make([]T, E)
	nG := max(c.Groups, 1)
	per := E / nG
	gScore := make([]T, nG)
	gKeep := make([]bool, nG)
	for t := 0; t < r.Tokens; t++ {
		copy(choice, r.Scores[t*E:t*E+E])
		if bias != nil {
			for e := range choice {
				choice[e] += bias[e]
			}
		}
		if nG > 1 {
			for g := 0; g < nG; g++ {
				grp := choice[g*per : g*per+per]
				if c.Score == moe.Sigmoid {
					// sum of the two best (one when a group has one expert)
					b1, b2 := T(math.Inf(-1)), T(math.Inf(-1))
					for _, v := range grp {
						if v > b1 {
							b1, b2 = v, b1
						} else if v > b2 {
							b2 = v
						}
					}
					if per == 1 {
						b2 = 0
					}
					gScore[g] = b1 + b2
				} else {
					b := T(math.Inf(-1))
					for _, v := range grp {
						b = max(b, v)
					}
					gScore[g] = b
				}
				gKeep[g] = false
			}
			for n := 0; n < c.TopKGroups; n++ {
				best := -1
				for g := 0; g < nG; g++ {
					if !gKeep[g] && (best < 0 || gScore[g] > gScore[best]) {
						best = g
					}
				}
				gKeep[best] = true
			}
			for g := 0; g < nG; g++ {
				if !gKeep[g] {
					clear(choice[g*per : g*per+per])
				}
			}
		}
		idx := r.Indices[t*K : t*K+K]
		for k := 0; k < K; k++ {
			best := -1
			for e := 0; e < E; e++ {
				taken := false
				for _, p := range idx[:k] {
					if int(p) == e {
						taken = true
						break
					}
				}
				if !taken && (best < 0 || choice[e] > choice[best]) {
					best = e
				}
			}
			idx[k] = int32(best)
		}
	}
}

// routeWeights fills Weights, Counts and Order from Indices and the
// selected scores vals [T,K] (vals[t·K+k] = Scores at Indices[t·K+k]).
func routeWeights[T Float](c *moe.Config, r *Routing[T], vals []T) {
	E, K := r.Experts, r.K
	norm, eps := c.NormTopK, T(c.NormTopKEps)
	scale := T(c.RoutedScale)
	clear(r.Counts)
	r.Values, r.Denom = nil, nil
	if norm {
		r.Values, r.Denom = vals, make([]T, r.Tokens)
	}
	for t := 0; t < r.Tokens; t++ {
		w := r.Weights[t*K : t*K+K]
		var sum T
		for k, e := range r.Indices[t*K : t*K+K] {
			w[k] = vals[t*K+k]
			sum += w[k]
			r.Counts[e]++
		}
		if norm {
			r.Denom[t] = sum + eps
		}
		for k := range w {
			if norm {
				w[k] /= sum + eps
			}
			w[k] *= scale
		}
	}
	off := make([]int, E)
	for e := 1; e < E; e++ {
		off[e] = off[e-1] + r.Counts[e-1]
	}
	for t := 0; t < r.Tokens; t++ {
		for k, e := range r.Indices[t*K : t*K+K] {
			r.Order[off[e]] = int32(t*K + k)
			off[e]++
		}
	}
}

// routeBwd turns dW [T,K] (and dS [T,E], already holding any aux-loss
// gradient) into the logit gradient dz [T,E], overwriting dz.
func routeBwd[T Float](c *moe.Config, r *Routing[T], dz, dS, dW []T) {
	kernel.ParallelFor(r.Tokens, 4*r.Experts, func(lo, hi int) { routeBwdRows(c, r, dz, dS, dW, lo, hi) })
}

// routeBwdRows is routeBwd on tokens [lo, hi) (each writes its own rows of
// dz and dS).
func routeBwdRows[T Float](c *moe.Config, r *Routing[T], dz, dS, dW []T, lo, hi int) {
	E, K := r.Experts, r.K
	norm := c.NormTopK
	scale := T(c.RoutedScale)
	for t := lo; t < hi; t++ {
		idx := r.Indices[t*K : t*K+K]
		dw := dW[t*K : t*K+K]
		ds := dS[t*E : t*E+E]
		st := r.Scores[t*E : t*E+E]
		if norm {
			// w_k = a·u_k/(U+ε), U = Σ u: ∂/∂u_j = a·(dw_j/(U+ε) − Σ_k dw_k·u_k/(U+ε)²)
			U, vals := r.Denom[t], r.Values[t*K:t*K+K]
			var dot T
			for k, v := range vals {
				dot += dw[k] * v
			}
			for k, e := range idx {
				ds[e] += scale * (dw[k]/U - dot/(U*U))
			}
		} else {
			for k, e := range idx {
				ds[e] += scale * dw[k]
			}
		}
		zt := dz[t*E : t*E+E]
		if c.Score == moe.Sigmoid {
			for e, s := range st {
				zt[e] = ds[e] * s * (1 - s)
			}
			continue
		}
		var dot T
		for e, s := range st {
			dot += ds[e] * s
		}
		for e, s := range st {
			zt[e] = s * (ds[e] - dot)
		}
	}
}

// CheckAux reports whether the HF load-balancing loss is defined for c
// (an error naming why not).
func CheckAux(c *moe.Config) error {
	if c.Score != moe.Softmax {
		return fmt.Errorf("aux loss: score = %q: HF's load_balancing_loss_func is defined for softmax routers only", c.Score)
	}
	if c.RouterBias {
		// GptOssForCausalLM records its router's first output, the
		// scattered top-k softmax, as the router logits
		// (modeling_gpt_oss.py, transformers 00d4b3d2): another function
		// of the routing than this one.
		return fmt.Errorf("aux loss: router_bias (GPT-OSS's router): HF feeds load_balancing_loss_func the router's top-k scores, not its logits; not implemented (use --aux-coef 0)")
	}
	return nil
}
