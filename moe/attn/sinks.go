package attn

import "math"

// Attention sinks (GPT-OSS): query head h has a learned logit s_h that joins
// every softmax row and multiplies no value row (eager_attention_forward in
// modeling_gpt_oss.py, transformers 00d4b3d2, concatenates it to the scores
// and drops its column after the softmax). With lse'_i and O'_i the
// log-sum-exp and output of row i over the keys alone (Forward),
//
//	lse_i = log(exp(lse'_i) + exp(s_h)),   O_i = exp(lse'_i − lse_i)·O'_i
//
// so a flash kernel without sinks plus this rescaling computes the sinks'
// attention. Backward needs no change of the flash backward given these O
// and lse: P_ij = exp(S_ij − lse_i) are the probabilities with the sink, and
// D_i = dO_i·O_i = Σ_j P_ij·(dO_i·v_j) is the softmax backward's row sum,
// in which the sink's column (no value, dP = 0) adds nothing. The sink's
// own gradient is its column's dS: with P_i,sink = exp(s_h − lse_i),
//
//	∂L/∂s_h = Σ_i P_i,sink·(0 − D_i) = −Σ_i exp(s_h − lse_i)·dO_i·O_i
//
// summed over every sequence and query row. Neither step is a multiply-add of
// QKᵀ or PV, so the attention op's count does not change (moe/sinks.go).

// SinksForward rescales Forward's o [T, H·DV] and lse [T, H] to include
// the sink logits sinks [H].
func SinksForward[T Float](o, lse, sinks []T, a Shape) {
	H, dv := a.Heads, a.vDim()
	for r := range lse {
		s, l := float64(sinks[r%H]), float64(lse[r])
		m := max(s, l)
		all := m + math.Log(math.Exp(l-m)+math.Exp(s-m))
		f := T(math.Exp(l - all))
		for e := range o[r*dv : r*dv+dv] {
			o[r*dv+e] *= f
		}
		lse[r] = T(all)
	}
}

// SinksBackward accumulates into dsinks [H] the sinks' gradient from do,
// the output o and lse SinksForward returned.
func SinksBackward[T Float](dsinks, sinks, do, o, lse []T, a Shape) {
	H, dv := a.Heads, a.vDim()
	acc := make([]float64, H)
	for r := range lse {
		var d float64
		for e, v := range o[r*dv : r*dv+dv] {
			d += float64(v) * float64(do[r*dv+e])
		}
		h := r % H
		acc[h] -= math.Exp(float64(sinks[h])-float64(lse[r])) * d
	}
	for h, v := range acc {
		dsinks[h] += T(v)
	}
}
