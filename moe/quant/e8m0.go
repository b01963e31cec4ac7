package quant

import "math"

// E8M0 is the MX spec v1.0's scale format: eight exponent bits,
// no sign, no mantissa, bias 127; code c is 2^(c−127) for c in [0, 254] and
// 0xFF is NaN.
type E8M0 uint8

// E8M0NaN is the NaN code.
const E8M0NaN E8M0 = 0xFF

// Value is the scale the code stands for.
func (c E8M0) Value() float64 {
	if c == E8M0NaN {
		return math.NaN()
	}
	return math.Ldexp(1, int(c)-127)
}

// MXScale is the shared scale of a block whose largest magnitude is amax,
// for elements of format elem, by the MX spec v1.0: X =
// 2^(⌊log₂ amax⌋ − emax_elem), clamped to E8M0's range [2^−127, 2^127]; a
// block of zeros gets the smallest scale, and a NaN or infinite amax the
// NaN code (as torchao's to_mx maps both, pytorch/ao 36027d82
// torchao/prototype/mx_formats/mx_tensor.py, "No-saturation E8M0
// conversion"). This is torchao's default ScaleCalculationMode.FLOOR.
func MXScale(amax float64, elem Format) E8M0 {
	if math.IsNaN(amax) || math.IsInf(amax, 0) {
		return E8M0NaN
	}
	e := -127
	if amax > 0 {
		_, fe := math.Frexp(amax)
		e = fe - 1 - elem.MaxExp()
	}
	return E8M0(min(max(e, -127), 127) + 127)
}
