package ref

import (
	"fmt"
	"math"
)

// Deviation is how far one run's loss and gradients lie from a baseline's
// on the same weights and tokens (a low-precision recipe against BF16).
type Deviation struct {
	Loss     float64 `json:"loss"`      // the run's total loss (Result.Total)
	BaseLoss float64 `json:"base_loss"` // the baseline's
	// GradRelL2 = ‖g − g_base‖₂ / ‖g_base‖₂ over every parameter together;
	// GradCosine the cosine of the angle between g and g_base.
	GradRelL2  float64 `json:"grad_rel_l2"`
	GradCosine float64 `json:"grad_cosine"`
}

// CompareHF runs ForwardBackwardHF on tokens with base (when not nil) and
// then with o, each from zero gradients, and returns o's result and its
// deviation from base (nil without one). m.Grad holds o's gradients
// afterwards.
func (m *Model[T]) CompareHF(tokens [][]int, base *Options, o Options) (Result, *Deviation, error) {
	clear(m.Grad)
	if base == nil {
		r, err := m.ForwardBackwardHF(tokens, 1, o)
		return r, nil, err
	}
	b, err := m.ForwardBackwardHF(tokens, 1, *base)
	if err != nil {
		return Result{}, nil, err
	}
	gb := append([]T(nil), m.Grad...)
	clear(m.Grad)
	r, err := m.ForwardBackwardHF(tokens, 1, o)
	if err != nil {
		return Result{}, nil, err
	}
	var diff, nb, ng, dot float64
	for i, v := range m.Grad {
		x, y := float64(v), float64(gb[i])
		diff += (x - y) * (x - y)
		nb += y * y
		ng += x * x
		dot += x * y
	}
	if nb == 0 || ng == 0 {
		return r, nil, fmt.Errorf("a gradient is zero everywhere (‖g_base‖² = %g, ‖g‖² = %g): no deviation to report", nb, ng)
	}
	return r, &Deviation{Loss: r.Total, BaseLoss: b.Total, GradRelL2: math.Sqrt(diff / nb), GradCosine: dot / math.Sqrt(nb*ng)}, nil
}
