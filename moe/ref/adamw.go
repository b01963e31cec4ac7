package ref

import "math"

// AdamW is torch.optim.AdamW (decoupled weight decay, bias-corrected, no
// amsgrad): at step t (from 1), for every trained parameter p with gradient g,
//
//	p ← p·(1 − lr·λ)
//	m ← m + (1 − β₁)·(g − m),   v ← β₂·v + (1 − β₂)·g²
//	p ← p − (lr/(1 − β₁ᵗ))·m / (√v/√(1 − β₂ᵗ) + ε)
//
// in the order torch's single-tensor implementation applies them.
type AdamW struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
}

// DefaultAdamW is torch.optim.AdamW's defaults: lr 1e-3, betas (0.9,
// 0.999), eps 1e-8, weight_decay 1e-2.
var DefaultAdamW = AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 1e-2}

// TorchtitanAdamW is torchtitan's default optimizer (job_config.py, class
// Optimizer, at commit 000204a4a8bf): AdamW with lr 8e-4, betas (0.9, 0.95),
// eps 1e-8, weight_decay 0.1.
var TorchtitanAdamW = AdamW{LR: 8e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}

// AdamState is the optimizer state of a set of parameters.
type AdamState[T Float] struct {
	Step int64 // steps taken
	M, V []T   // first and second moments, one per parameter element
}

// AdamWStep applies one AdamW step to p in place from g, advancing st
// (allocated on first use). p, g, st.M and st.V have equal lengths.
func AdamWStep[T Float](a AdamW, st *AdamState[T], p, g []T) {
	if st.M == nil {
		st.M, st.V = make([]T, len(p)), make([]T, len(p))
	}
	st.Step++
	bc1 := 1 - math.Pow(a.Beta1, float64(st.Step))
	bc2 := math.Sqrt(1 - math.Pow(a.Beta2, float64(st.Step)))
	decay := T(1 - a.LR*a.WeightDecay)
	b1, b2 := T(a.Beta1), T(a.Beta2)
	stepSize := T(a.LR / bc1)
	sq2, eps := T(bc2), T(a.Eps)
	m, v := st.M[:len(p)], st.V[:len(p)]
	for i, gi := range g[:len(p)] {
		p[i] *= decay
		m[i] += (1 - b1) * (gi - m[i]) // torch: exp_avg.lerp_(grad, 1-β₁)
		v[i] = b2*v[i] + (1-b2)*gi*gi
		denom := T(math.Sqrt(float64(v[i])))/sq2 + eps
		p[i] -= stepSize * m[i] / denom
	}
}
