// Package rope builds a Config's RoPE tables for moe/ref's blocks.
package rope

import (
	"math"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/attn"
)

// RoPE's frequencies for a Config (the rotation is attn.Rope's): the first
// r = Config.RotaryDim() elements of each head rotate by θ_i = p·base^(−2i/r)
// for i < r/2, YaRN-scaled when the config has YaRN. Positions restart at 0
// in every sequence of the micro-batch. With Config.RopeInterleave the pairs
// are adjacent: DeepSeek-V2's and Llama 4's complex-number RoPE exactly, and
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

// Table is the table of positions 0 … seq−1.
func Table[T attn.Float](c *moe.Config, seq int) attn.Rope[T] {
	pos := make([]int, seq)
	for p := range pos {
		pos[p] = p
	}
	return TableAt[T](c, pos)
}

// TableAt is the table whose row p rotates by position pos[p]: a
// context-parallel rank's tokens keep the positions they have in the
// whole sequence. cos and sin carry YaRN's attention factor when the
// config has one.
func TableAt[T attn.Float](c *moe.Config, pos []int) attn.Rope[T] {
	scale := 1.0
	if c.Yarn != nil {
		scale = c.Yarn.AttentionFactor
	}
	return attn.NewRope[T](invFreq(c.Yarn, c.RotaryDim(), c.RopeTheta), scale, c.RopeInterleave, pos)
}

// Temperatures is Llama 4's temperature factor of every local position
// (pos[p], or p when pos is nil) on layer l: nil unless the layer is NoPE
// and the config tunes temperature (moe/llama4.go).
func Temperatures(c *moe.Config, l, seq int, pos []int) []float64 {
	if c.Temperature == nil || c.Roped(l) {
		return nil
	}
	f := make([]float64, seq)
	for p := range f {
		at := p
		if pos != nil {
			at = pos[p]
		}
		f[p] = c.Temperature.Factor(at)
	}
	return f
}
