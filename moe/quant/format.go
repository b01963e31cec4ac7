package quant

import "math"

// Format is a binary floating-point element format narrower than float32:
// a sign bit, ExpBits exponent bits with bias Bias and ManBits mantissa
// bits, subnormals at the smallest exponent. Max is the largest finite
// magnitude. HasInf says the format encodes infinities (only E5M2 here);
// HasNaN that it encodes NaN (E4M3 and E5M2; E2M1 encodes neither).
type Format struct {
	Name             string
	ExpBits, ManBits int
	Bias             int
	Max              float64
	HasInf, HasNaN   bool
}

// The element formats. E4M3 and E5M2: OCP OFP8 spec rev 1.0, its table of the two encodings (E4M3:
// bias 7, max normal S.1111.110₂ = 448, no infinities, NaN S.1111.111₂;
// E5M2: bias 15, max normal S.11110.11₂ = 57344, infinities and NaN as in
// IEEE 754). E2M1: OCP MX spec v1.0, its FP4 element format (bias 1, max normal S.11.1₂ = 6,
// no infinities and no NaN).
var (
	E4M3 = Format{Name: "e4m3", ExpBits: 4, ManBits: 3, Bias: 7, Max: 448, HasNaN: true}
	E5M2 = Format{Name: "e5m2", ExpBits: 5, ManBits: 2, Bias: 15, Max: 57344, HasInf: true, HasNaN: true}
	E2M1 = Format{Name: "e2m1", ExpBits: 2, ManBits: 1, Bias: 1, Max: 6}
)

// MaxExp is the exponent of the largest normal value (E4M3 8, E5M2 15,
// E2M1 2): the MX spec's emax_elem, subtracted from a block's amax exponent
// to give its shared scale.
func (f Format) MaxExp() int {
	_, e := math.Frexp(f.Max)
	return e - 1
}

// Overflow says what a conversion does with a finite value beyond Max
// after rounding, and with an infinity.
type Overflow int

const (
	// Saturate clamps to ±Max (infinities too). What torchao's
	// to_fp8_saturated and TransformerEngine's casts do, the OFP8 spec's
	// saturating mode, and the only choice for E2M1.
	Saturate Overflow = iota
	// NoSaturate gives ±Inf where the format has infinities and NaN where it
	// has none (the OFP8 spec's non-saturating mode).
	NoSaturate
)

// Round rounds x to the nearest value of f, ties to even, subnormals
// included, with overflow handled as o says. NaN stays NaN (for E2M1,
// which cannot encode it, the result is NaN all the same: the MX spec makes
// a block holding a NaN decode to NaN through its scale).
func (f Format) Round(x float64, o Overflow) float64 { return f.round(x, o, -1) }

// RoundStochastic rounds x down or up to one of the two nearest values of
// f with probability proportional to its closeness: up when u, uniform in
// [0, 1), is below the fraction of the gap x lies above the lower one.
// Overflow saturates.
func (f Format) RoundStochastic(x, u float64) float64 { return f.round(x, Saturate, u) }

// round implements Round (u < 0) and RoundStochastic. The quantum of x's
// binade is 2^(e−ManBits) with e = max(⌊log₂|x|⌋, 1−Bias) (below 1−Bias the
// subnormals share the smallest binade's quantum); |x|/quantum is exact in
// float64 for a float32 x, so one rounding of it to an integer is the
// conversion. A rounding up into the next binade stays exact (an integer
// mantissa of 2^(ManBits+1) is that binade's first value).
func (f Format) round(x float64, o Overflow, u float64) float64 {
	switch {
	case math.IsNaN(x):
		return math.NaN()
	case math.IsInf(x, 0):
		return f.overflow(x, o)
	case x == 0:
		return x
	}
	a := math.Abs(x)
	_, e := math.Frexp(a) // a = m·2^e, m in [0.5, 1)
	e = max(e-1, 1-f.Bias)
	q := math.Ldexp(1, e-f.ManBits)
	n := a / q
	var r float64
	if u < 0 {
		r = math.RoundToEven(n)
	} else {
		r = math.Floor(n)
		if u < n-r {
			r++
		}
	}
	v := math.Copysign(r*q, x)
	if r*q > f.Max {
		return f.overflow(v, o)
	}
	return v
}

func (f Format) overflow(x float64, o Overflow) float64 {
	switch {
	case o == Saturate || !f.HasNaN:
		return math.Copysign(f.Max, x)
	case f.HasInf:
		return math.Inf(int(math.Copysign(1, x)))
	}
	return math.NaN()
}

// Decode is the value of the element code (its low 1 + ExpBits + ManBits
// bits: sign, exponent, mantissa): (−1)^s·2^(1−Bias)·m/2^ManBits for the
// zero exponent (subnormals), (−1)^s·2^(e−Bias)·(1 + m/2^ManBits)
// otherwise; E5M2's all-ones exponent is ±Inf (mantissa 0) or NaN, E4M3's
// all-ones exponent and mantissa NaN (the OFP8 and MX specs' encodings).
// E2M1 decodes to ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
func (f Format) Decode(code uint) float64 {
	man := code & (1<<f.ManBits - 1)
	exp := code >> f.ManBits & (1<<f.ExpBits - 1)
	neg := code>>(f.ManBits+f.ExpBits)&1 == 1
	allExp := exp == 1<<f.ExpBits-1
	var v float64
	switch {
	case f.HasInf && allExp && man == 0:
		v = math.Inf(1)
	case f.HasNaN && allExp && (f.HasInf || man == 1<<f.ManBits-1):
		return math.NaN()
	case exp == 0:
		v = math.Ldexp(float64(man), 1-f.Bias-f.ManBits)
	default:
		v = math.Ldexp(float64(man|1<<f.ManBits), int(exp)-f.Bias-f.ManBits)
	}
	if neg {
		return -v
	}
	return v
}
