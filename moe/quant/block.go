package quant

import (
	"math"
	"math/rand/v2"
)

// block is one block's scale: a value is encoded as round(v·enc) and
// decoded as that times dec. nan marks a block with a non-finite amax; zero
// a block whose scale underflows to zero (every value decodes to 0).
type block struct {
	enc, dec  float32
	nan, zero bool
}

// global is NVFP4's tensor scale: enc = 448·6/amax_tensor in float32 (1
// when amax is 0, capped at the float32 maximum), dec = 1/enc
// (reference_nvfp4.py, _quantize_blockwise_reference).
type global struct {
	enc, dec float32
	nan      bool
}

func newGlobal(amax float64) global {
	if math.IsNaN(amax) {
		return global{nan: true}
	}
	enc := float32(E4M3.Max*E2M1.Max) / float32(amax)
	if enc == 0 || amax == 0 {
		enc = 1
	}
	enc = min(enc, math.MaxFloat32)
	return global{enc: enc, dec: 1 / enc}
}

// block computes the scale of a block with largest magnitude amax.
func (s Scaling) block(amax float64, g global) block {
	if math.IsNaN(amax) || g.nan {
		return block{nan: true}
	}
	switch s.Rule {
	case MXE8M0:
		x := float32(MXScale(amax, s.Elem).Value())
		return block{enc: 1 / x, dec: x, zero: x == 0}
	case NVFP4:
		// s_block = amax_block·(enc_global/6), clamped to 448 and stored
		// as E4M3; the encoding scale is 1/(s_block·dec_global).
		d := min(float32(amax)*(g.enc*(1/float32(E2M1.Max))), math.MaxFloat32)
		d = float32(E4M3.Round(float64(min(d, float32(E4M3.Max))), Saturate))
		if d == 0 {
			return block{zero: true}
		}
		return block{enc: min(1/(d*g.dec), math.MaxFloat32), dec: d * g.dec}
	}
	// torchao clamps amax to EPS = 1e-12 before dividing (float8_utils.py).
	enc := float32(s.Elem.Max) / max(float32(amax), 1e-12)
	if s.Rule == AmaxPow2 {
		enc = float32(math.Exp2(math.Floor(math.Log2(float64(enc)))))
	}
	return block{enc: enc, dec: 1 / enc}
}

// quantise returns v encoded, rounded to s.Elem (saturating) and decoded.
// The scaled value is formed in float32, as the frameworks' kernels do.
func (b block) quantise(s Scaling, v float32, rng *rand.Rand) float32 {
	switch {
	case b.nan:
		return float32(math.NaN())
	case b.zero:
		return 0
	}
	x := float64(v * b.enc)
	var q float64
	if s.Stochastic {
		q = s.Elem.RoundStochastic(x, rng.Float64())
	} else {
		q = s.Elem.Round(x, Saturate)
	}
	switch s.Rule {
	case MXE8M0, AmaxPow2:
		return float32(q * float64(b.dec)) // exact: a power of two
	case NVFP4:
		return float32(q) * b.dec
	}
	return float32(q) / b.enc // torchao's Float8Tensor divides by its scale
}
