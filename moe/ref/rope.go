package ref

import (
	"math"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/kernel"
)

// RoPE as Hugging Face's apply_rotary_pos_emb with partial rotary: within
// each head vector of d elements only the first r = Config.RotaryDim() are
// rotated, by rotate_half over that slice. With h = r/2, position p and
// θ_i = p·base^(−2i/r) for i < h:
//
//	y_i   = x_i·cos θ_i − x_{i+h}·sin θ_i
//	y_i+h = x_{i+h}·cos θ_i + x_i·sin θ_i
//
// and the remaining d − r elements pass through. Backward is the transposed
// rotation (times the same YaRN attention factor, which scales cos and
// sin). Positions restart at 0 in every sequence of the micro-batch.
// With Config.RopeInterleave the pairs are adjacent, (x_2i, x_2i+1), and
// stay in place: DeepSeek-V2's complex-number RoPE exactly, and
// DeepSeek-V3's rope_interleave up to one permutation of the rotated dims
// applied to both q and k, which leaves every q·k unchanged.

// invFreq returns the h = r/2 inverse frequencies of RoPE with base theta,
// scaled by y when y is not nil.
func invFreq(y *moe.Yarn, r int, theta float64) []float64 {
	h := r / 2
	f := make([]float64, h)
	for i := range f {
		f[i] = 1 / math.Pow(theta, float64(2*i)/float64(r))
	}
	if y == nil {
		return f
	}
	dim := func(beta float64) float64 {
		return float64(r) * math.Log(float64(y.OriginalMaxPositions)/(2*math.Pi*beta)) / (2 * math.Log(theta))
	}
	lo, hi := dim(y.BetaFast), dim(y.BetaSlow)
	if y.Truncate {
		lo, hi = math.Floor(lo), math.Ceil(hi)
	}
	lo, hi = math.Max(lo, 0), math.Min(hi, float64(r-1))
	if lo == hi {
		hi += 0.001
	}
	for i := range f {
		ramp := math.Min(math.Max((float64(i)-lo)/(hi-lo), 0), 1)
		f[i] = f[i]/y.Factor*ramp + f[i]*(1-ramp)
	}
	return f
}

// ropeTable holds cos and sin of θ_i for every position: [seq, r/2] each,
// times YaRN's attention factor when the config has one.
type ropeTable[T Float] struct {
	cos, sin   []T
	half       int
	interleave bool
}

func newRopeTable[T Float](c *moe.Config, seq int) ropeTable[T] {
	pos := make([]int, seq)
	for p := range pos {
		pos[p] = p
	}
	return newRopeTableAt[T](c, pos)
}

// newRopeTableAt is the table whose row p rotates by position pos[p]: a
// context-parallel rank's tokens keep the positions they have in the
// whole sequence.
func newRopeTableAt[T Float](c *moe.Config, pos []int) ropeTable[T] {
	r := c.RotaryDim()
	h := r / 2
	seq := len(pos)
	t := ropeTable[T]{cos: make([]T, seq*h), sin: make([]T, seq*h), half: h, interleave: c.RopeInterleave}
	scale := 1.0
	if c.Yarn != nil {
		scale = c.Yarn.AttentionFactor
	}
	for i, inv := range invFreq(c.Yarn, r, c.RopeTheta) {
		for p := 0; p < seq; p++ {
			s, co := math.Sincos(float64(pos[p]) * inv)
			t.cos[p*h+i], t.sin[p*h+i] = T(scale*co), T(scale*s)
		}
	}
	return t
}

// apply rotates x [T tokens, heads·d] in place; tokens are sequences of seq
// positions back to back. inverse applies the transposed rotation (backward).
func (t ropeTable[T]) apply(x []T, heads, d, seq int, inverse bool) {
	t.applyAt(x, heads, d, 0, seq, inverse)
}

// applyAt is apply on the r dims from off of every head of stride dims
// (MLA rotates each head's last qk_rope_head_dim dims).
func (t ropeTable[T]) applyAt(x []T, heads, stride, off, seq int, inverse bool) {
	h := t.half
	rows := len(x) / (heads * stride)
	kernel.ParallelFor(rows, heads*2*h, func(lo, hi int) { t.applyRows(x, heads, stride, off, seq, inverse, lo, hi) })
}

// applyRows is applyAt on tokens [lo, hi) (each token's rows are its own).
func (t ropeTable[T]) applyRows(x []T, heads, stride, off, seq int, inverse bool, lo, hi int) {
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
