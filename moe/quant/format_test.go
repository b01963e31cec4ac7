package quant

import (
	"math"
	"testing"
)

// The expected values are worked by hand from the format definitions (OCP
// OFP8 spec rev 1.0 for E4M3/E5M2, OCP MX spec v1.0 for E2M1 and E8M0):
// each row says which value it is and why.
func TestRoundHandValues(t *testing.T) {
	inf := math.Inf(1)
	cases := []struct {
		f        Format
		x        float64
		o        Overflow
		want     float64
		whatItIs string
	}{
		// E4M3: bias 7, 3 mantissa bits; binade [1, 2) has quantum 1/8.
		{E4M3, 1.0625, Saturate, 1, "1 + 1/16: tie between 1.000₂ and 1.001₂, to the even 1"},
		{E4M3, 1.1875, Saturate, 1.25, "1 + 3/16: tie between 1.001₂ and 1.010₂, to the even 1.25"},
		{E4M3, 1.2, Saturate, 1.25, "nearest of 1.125 and 1.25"},
		{E4M3, 448, Saturate, 448, "max normal S.1111.110₂ = 1.75·2^8"},
		{E4M3, 464, NoSaturate, 448, "midway 448..480: tie to the even 448 (480 would be the NaN code)"},
		{E4M3, 465, NoSaturate, math.NaN(), "beyond the tie: overflows, and E4M3 has no Inf, so NaN"},
		{E4M3, 465, Saturate, 448, "saturating: clamps to 448"},
		{E4M3, inf, Saturate, 448, "saturating: Inf clamps to 448"},
		{E4M3, inf, NoSaturate, math.NaN(), "non-saturating: Inf is NaN (no Inf encoding)"},
		{E4M3, -1000, Saturate, -448, "sign kept when clamping"},
		{E4M3, math.Ldexp(1, -9), Saturate, math.Ldexp(1, -9), "smallest subnormal 0.0000.001₂ = 2^-6·2^-3"},
		{E4M3, math.Ldexp(1, -10), Saturate, 0, "half the smallest subnormal: tie between 0 and 2^-9, to the even 0"},
		{E4M3, math.Ldexp(3, -11), Saturate, math.Ldexp(1, -9), "0.75·2^-9 rounds up to 2^-9"},
		{E4M3, math.Ldexp(3, -10), Saturate, math.Ldexp(2, -9), "1.5·2^-9: tie between 1 and 2 quanta, to the even 2·2^-9"},
		{E4M3, math.Ldexp(7, -9), Saturate, math.Ldexp(7, -9), "largest subnormal 0.0000.111₂ = 7·2^-9"},
		{E4M3, math.Ldexp(15, -10), Saturate, math.Ldexp(1, -6), "7.5·2^-9: tie between 7·2^-9 and the smallest normal 2^-6, to the even 2^-6"},
		// E5M2: bias 15, 2 mantissa bits.
		{E5M2, 57344, NoSaturate, 57344, "max normal S.11110.11₂ = 1.75·2^15"},
		{E5M2, 61439, NoSaturate, 57344, "just below the midway 61440: to 57344"},
		{E5M2, 61440, NoSaturate, inf, "midway 57344..65536: tie to the even 2^16, which overflows to Inf"},
		{E5M2, 61440, Saturate, 57344, "saturating: clamps to max"},
		{E5M2, -inf, NoSaturate, -inf, "Inf stays Inf without saturation"},
		{E5M2, 1.125, Saturate, 1, "1 + 1/8: tie between 1.00₂ and 1.01₂, to the even 1"},
		{E5M2, 1.375, Saturate, 1.5, "1 + 3/8: tie between 1.01₂ and 1.10₂, to the even 1.5"},
		{E5M2, math.Ldexp(1, -16), Saturate, math.Ldexp(1, -16), "smallest subnormal 2^-14·2^-2"},
		{E5M2, math.Ldexp(1, -17), Saturate, 0, "half of it: tie to the even 0"},
		// E2M1: values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
		{E2M1, 0.25, Saturate, 0, "midway 0..0.5 (subnormal 0.5 = 0.1₂·2^0): tie to the even 0"},
		{E2M1, 0.75, Saturate, 1, "midway 0.5..1: tie to the even 1 (1.0₂)"},
		{E2M1, 1.25, Saturate, 1, "midway 1..1.5: tie to the even 1"},
		{E2M1, 1.75, Saturate, 2, "midway 1.5..2: tie to the even 2"},
		{E2M1, 2.5, Saturate, 2, "midway 2..3: tie to the even 2"},
		{E2M1, 3.5, Saturate, 4, "midway 3..4: tie to the even 4"},
		{E2M1, 5, Saturate, 4, "midway 4..6: tie to the even 4 (1.0₂·2^2)"},
		{E2M1, 5.1, Saturate, 6, "above the midway: 6"},
		{E2M1, 7, NoSaturate, 6, "beyond 6: E2M1 has no Inf or NaN, so it saturates"},
		{E2M1, -inf, Saturate, -6, "-Inf saturates to -6"},
		{E2M1, math.NaN(), Saturate, math.NaN(), "NaN stays NaN (a NaN block decodes to NaN through its scale)"},
	}
	for _, c := range cases {
		got := c.f.Round(c.x, c.o)
		if !same(got, c.want) {
			t.Errorf("%s.Round(%g, %d) = %g, want %g: %s", c.f.Name, c.x, c.o, got, c.want, c.whatItIs)
		}
	}
}

func TestRoundSignedZero(t *testing.T) {
	// A negative value that rounds to zero keeps its sign, as IEEE 754 and
	// the OFP8 encodings (S.0000.000₂ with S = 1) do.
	if got := E4M3.Round(-math.Ldexp(1, -11), Saturate); got != 0 || !math.Signbit(got) {
		t.Errorf("E4M3.Round(-2^-11) = %g (signbit %v), want -0", got, math.Signbit(got))
	}
}

func TestRoundStochastic(t *testing.T) {
	// 2.25 lies a quarter of the way from 2 to 3 in E2M1: u below 0.25
	// rounds up, u at or above rounds down.
	for _, c := range []struct{ u, want float64 }{{0, 3}, {0.2499, 3}, {0.25, 2}, {0.9, 2}} {
		if got := E2M1.RoundStochastic(2.25, c.u); got != c.want {
			t.Errorf("E2M1.RoundStochastic(2.25, %g) = %g, want %g", c.u, got, c.want)
		}
	}
	// A representable value never moves; beyond max it saturates.
	if got := E2M1.RoundStochastic(3, 0); got != 3 {
		t.Errorf("E2M1.RoundStochastic(3, 0) = %g, want 3", got)
	}
	if got := E2M1.RoundStochastic(-10, 0); got != -6 {
		t.Errorf("E2M1.RoundStochastic(-10, 0) = %g, want -6", got)
	}
}

func TestMaxExp(t *testing.T) {
	// emax_elem of the MX spec: 448 = 1.75·2^8, 57344 = 1.75·2^15, 6 = 1.5·2^2.
	for _, c := range []struct {
		f    Format
		want int
	}{{E4M3, 8}, {E5M2, 15}, {E2M1, 2}} {
		if got := c.f.MaxExp(); got != c.want {
			t.Errorf("%s.MaxExp() = %d, want %d", c.f.Name, got, c.want)
		}
	}
}

func TestE8M0(t *testing.T) {
	// Codes: 127 is 2^0, 0 is 2^-127, 254 is 2^127, 0xFF NaN (MX spec v1.0).
	for _, c := range []struct {
		code E8M0
		want float64
	}{{127, 1}, {0, math.Ldexp(1, -127)}, {254, math.Ldexp(1, 127)}, {130, 8}, {E8M0NaN, math.NaN()}} {
		if got := c.code.Value(); !same(got, c.want) {
			t.Errorf("E8M0(%d).Value() = %g, want %g", c.code, got, c.want)
		}
	}
	// Shared scales: X = 2^(⌊log₂ amax⌋ − emax_elem).
	for _, c := range []struct {
		amax float64
		elem Format
		want E8M0
		why  string
	}{
		{448, E4M3, 127, "⌊log₂ 448⌋ = 8, minus 8: 2^0"},
		{500, E4M3, 127, "⌊log₂ 500⌋ = 8: 2^0 (500 then saturates to 448)"},
		{512, E4M3, 128, "⌊log₂ 512⌋ = 9: 2^1"},
		{1, E4M3, 119, "2^(0−8)"},
		{6, E2M1, 127, "⌊log₂ 6⌋ = 2, minus 2: 2^0"},
		{0, E4M3, 0, "a block of zeros: the smallest scale 2^-127"},
		{math.Ldexp(1, 200), E4M3, 254, "2^(200−8) clamps to 2^127"},
		{math.Inf(1), E4M3, E8M0NaN, "infinite amax: NaN scale"},
		{math.NaN(), E2M1, E8M0NaN, "NaN amax: NaN scale"},
	} {
		if got := MXScale(c.amax, c.elem); got != c.want {
			t.Errorf("MXScale(%g, %s) = %d, want %d: %s", c.amax, c.elem.Name, got, c.want, c.why)
		}
	}
}

// same is equality with NaN equal to NaN.
func same(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }

// TestDecode: E2M1's sixteen codes by hand from the MX spec v1.0 (bias 1:
// exponent 0 gives the subnormal 0.5·m, exponent e > 0 gives 2^(e−1)·(1 +
// m/2)), and for every format every finite code's value is a fixed point
// of Round (Decode inverts the rounding's grid); E4M3's 0x7F and E5M2's
// 0x7C, 0x7D are NaN, +Inf and NaN; E4M3's 0x7E is its max 448.
func TestDecode(t *testing.T) {
	e2m1 := []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	for code := uint(0); code < 16; code++ {
		want := e2m1[code&7]
		if code&8 != 0 {
			want = -want
		}
		if got := E2M1.Decode(code); got != want || math.Signbit(got) != (code&8 != 0) {
			t.Errorf("E2M1 code %04b = %v, want %v", code, got, want)
		}
	}
	for _, f := range []Format{E4M3, E5M2, E2M1} {
		for code := uint(0); code < 1<<(1+f.ExpBits+f.ManBits); code++ {
			v := f.Decode(code)
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			if r := f.Round(v, Saturate); r != v {
				t.Errorf("%s code %#x decodes to %v, which rounds to %v", f.Name, code, v, r)
			}
		}
	}
	if !math.IsNaN(E4M3.Decode(0x7F)) || E4M3.Decode(0x7E) != 448 || !math.IsInf(E5M2.Decode(0x7C), 1) || !math.IsNaN(E5M2.Decode(0x7D)) {
		t.Errorf("E4M3 0x7F %v 0x7E %v, E5M2 0x7C %v 0x7D %v", E4M3.Decode(0x7F), E4M3.Decode(0x7E), E5M2.Decode(0x7C), E5M2.Decode(0x7D))
	}
}
