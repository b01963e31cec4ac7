package attn

import (
	"math"

	"github.com/moescope/moescope/moe/kernel"
)

// RoPE as Hugging Face's apply_rotary_pos_emb with partial rotary: within
// each head vector only the first r = 2·half elements from an offset are
// rotated, by rotate_half over that slice. With h = half, position p and
// θ_i = p·invFreq_i:
//
//	y_i   = x_i·cos θ_i − x_{i+h}·sin θ_i
//	y_i+h = x_{i+h}·cos θ_i + x_i·sin θ_i
//
// and the remaining elements pass through. With interleave the pairs are
// adjacent, (x_2i, x_2i+1), and stay in place (DeepSeek-V2's and Llama 4's
// complex-number RoPE). Backward is the transposed rotation. cos and sin
// carry a constant factor (YaRN's attention factor), so the backward
// multiplies by it too. The frequencies (plain or YaRN) are moe/ref's.

// Rope holds cos and sin of θ_i for every row position: [rows, half] each.
type Rope[T Float] struct {
	cos, sin   []T
	half       int
	interleave bool
}

// NewRope is the table whose row p rotates by position pos[p] with the
// inverse frequencies invFreq (half of them), cos and sin times scale.
func NewRope[T Float](invFreq []float64, scale float64, interleave bool, pos []int) Rope[T] {
	h, seq := len(invFreq), len(pos)
	t := Rope[T]{cos: make([]T, seq*h), sin: make([]T, seq*h), half: h, interleave: interleave}
	for i, inv := range invFreq {
		for p := 0; p < seq; p++ {
			s, co := math.Sincos(float64(pos[p]) * inv)
			t.cos[p*h+i], t.sin[p*h+i] = T(scale*co), T(scale*s)
		}
	}
	return t
}

// Apply rotates x [T tokens, heads·d] in place; tokens are sequences of seq
// positions back to back. inverse applies the transposed rotation (backward).
func (t Rope[T]) Apply(x []T, heads, d, seq int, inverse bool) {
	t.ApplyAt(x, heads, d, 0, seq, inverse)
}

// ApplyAt is Apply on the r dims from off of every head of stride dims
// (MLA rotates each head's last qk_rope_head_dim dims).
func (t Rope[T]) ApplyAt(x []T, heads, stride, off, seq int, inverse bool) {
	h := t.half
	rows := len(x) / (heads * stride)
	kernel.ParallelFor(rows, heads*2*h, func(lo, hi int) { t.applyRows(x, heads, stride, off, seq, inverse, lo, hi) })
}

// applyRows is ApplyAt on tokens [lo, hi) (each token's rows are its own).
func (t Rope[T]) applyRows(x []T, heads, stride, off, seq int, inverse bool, lo, hi int) {
	h := t.half
	for tok := lo; tok < hi; tok++ {
		p := tok % seq
		cs, sn := t.cos[p*h:p*h+h], t.sin[p*h:p*h+h]
		for hd := 0; hd < heads; hd++ {
			v := x[(tok*heads+hd)*stride+off:]
			for i := 0; i < h; i++ {
				ia, ib := i, i+h
				if t.interleave {
					ia, ib = 2*i, 2*i+1
				}
				a, b := v[ia], v[ib]
				c, s := cs[i], sn[i]
				if inverse {
					s = -s
				}
				v[ia] = a*c - b*s
				v[ib] = b*c + a*s
			}
		}
	}
}
