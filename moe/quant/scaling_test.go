package quant

import (
	"math"
	"testing"
)

// Hand-worked fake quantisation: each case gives the operand, the expected
// values and the arithmetic that gives them, from the recipes' definitions
// (scale = 448/amax, rounded down to a power of two where the recipe says;
// MX: 2^(⌊log₂ amax⌋ − 8); NVFP4: the two-level scale) and E4M3/E2M1
// rounding.
func TestApplyHandValues(t *testing.T) {
	cases := []struct {
		name       string
		s          Scaling
		rows, cols int
		axis       Axis
		in, want   []float32
	}{
		{"tensorwise: amax 3.5, scale 448/3.5 = 128; 1.3·128 = 166.4 → 160 (quantum 16) → 1.25",
			tensorE4M3, 1, 3, AlongCols, []float32{0.5, 1.3, 3.5}, []float32{0.5, 1.25, 3.5}},
		{"rowwise pow2: row 0 amax 3, 448/3 → 128: exact; row 1 amax 10, 44.8 → 32: 0.1·32 = 3.2 → 3.25 (quantum 1/4) → 0.1015625",
			rowPow2, 2, 2, AlongCols, []float32{1, 3, 10, 0.1}, []float32{1, 3, 10, 0.1015625}},
		{"rowwise along rows: the same scales by column of the transposed operand",
			rowPow2, 2, 2, AlongRows, []float32{1, 10, 3, 0.1}, []float32{1, 10, 3, 0.1015625}},
		{"MX: amax 1, scale 2^(0−8); 0.3·256 = 76.8 → 80 (quantum 8) → 0.3125",
			mx32, 1, 32, AlongCols, pad32(1, 0.3), pad32(1, 0.3125)},
		{"MX: amax 511, scale 2^(8−8) = 1; 511 rounds to 512 > 448: saturates to 448",
			mx32, 1, 32, AlongCols, pad32(511, 3), pad32(448, 3)},
		{"MX: a block of zeros stays zero (scale 2^-127)",
			mx32, 1, 32, AlongCols, pad32(0, 0), pad32(0, 0)},
		{"NVFP4: tensor amax 2688 = 448·6 makes the tensor scale 1; block 0 amax 6 → block scale 1: plain E2M1 (2.5 → 2, 0.25 → 0, 5 → 4); block 1 amax 2688 → scale 448: 1000/448 = 2.23 → 2 → 896",
			nvfp4Act, 1, 32, AlongCols, nv32([]float32{6, 2.5, 0.25, 5}, []float32{2688, 1000}), nv32([]float32{6, 2, 0, 4}, []float32{2688, 896})},
		{"NVFP4: a block whose E4M3 scale (0.001/6 < 2^-10) underflows to 0 decodes to zeros",
			nvfp4Act, 1, 32, AlongCols, nv32([]float32{0.001}, []float32{2688}), nv32([]float32{0}, []float32{2688})},
	}
	for _, c := range cases {
		got := make([]float32, len(c.in))
		c.s.Apply(got, c.in, c.rows, c.cols, c.axis, nil)
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%s: element %d = %v, want %v", c.name, i, got[i], c.want[i])
			}
		}
	}
}

// pad32 is a 32-element MX block holding a, b and then 0.5s (which E4M3
// holds exactly at any of these scales).
func pad32(a, b float32) []float32 {
	v := []float32{a, b}
	for len(v) < 32 {
		v = append(v, 0.5*float32(min(1, a)))
	}
	return v
}

// nv32 is two 16-element NVFP4 blocks starting with a and b, zeros after.
func nv32(a, b []float32) []float32 {
	v := make([]float32, 32)
	copy(v, a)
	copy(v[16:], b)
	return v
}

func TestBlockwiseScopes(t *testing.T) {
	// 1×128: two blocks of one row, amax 2 and 100: scales 448/2 → 128 and
	// 448/100 → 4. 0.0003·128 = 0.0384 → 0.0390625 (quantum 2^-8) →
	// 0.00030517578125; 0.0003·4 = 0.0012, an E4M3 subnormal (quantum 2^-9)
	// → 2^-9 → 0.00048828125.
	in := make([]float32, 256)
	in[0], in[1], in[128], in[129] = 2, 0.0003, 100, 0.0003
	got := make([]float32, 256)
	block1x128.Apply(got, in, 1, 256, AlongCols, nil)
	if got[1] != 0.00030517578125 || got[129] != 0.00048828125 {
		t.Errorf("1×128 blocks: %v and %v, want 0.00030517578125 and 0.00048828125", got[1], got[129])
	}
	// 128×128: row 1's 100 shares row 0's block, so 0.0003 in row 0 takes
	// the scale 4; per-row (1×128) it keeps the scale of its own row (128).
	in = make([]float32, 2*128)
	in[0], in[1], in[128] = 2, 0.0003, 100
	block128.Apply(got, in, 2, 128, AlongCols, nil)
	if got[1] != 0.00048828125 {
		t.Errorf("128×128 block: %v, want 0.00048828125 (scale 4 from row 1)", got[1])
	}
	block1x128.Apply(got, in, 2, 128, AlongCols, nil)
	if got[1] != 0.00030517578125 {
		t.Errorf("1×128 block: %v, want 0.00030517578125 (row 0's own scale 128)", got[1])
	}
}

func TestNonFiniteBlock(t *testing.T) {
	// A NaN or Inf makes its block NaN (MX: the NaN scale) and leaves the
	// other blocks alone.
	in := make([]float32, 64)
	in[0], in[32] = float32(math.Inf(1)), 1
	got := make([]float32, 64)
	mx32.Apply(got, in, 1, 64, AlongCols, nil)
	if !math.IsNaN(float64(got[1])) || got[32] != 1 {
		t.Errorf("MX with Inf in block 0: %v, %v; want NaN, 1", got[1], got[32])
	}
}

func TestHadamard(t *testing.T) {
	// Row 0 of the Sylvester matrix is all ones and its sign is +1: e₀·H is
	// 1/4 everywhere; the inverse brings it back.
	x := make([]float32, 16)
	x[0] = 1
	rht(x, 16, false)
	for j, v := range x {
		if v != 0.25 {
			t.Fatalf("e0·H [%d] = %v, want 0.25", j, v)
		}
	}
	rht(x, 16, true)
	for j, v := range x {
		if want := float32(0); j == 0 {
			want = 1
			if math.Abs(float64(v-want)) > 1e-6 {
				t.Errorf("inverse [%d] = %v, want %v", j, v, want)
			}
		} else if math.Abs(float64(v)) > 1e-6 {
			t.Errorf("inverse [%d] = %v, want 0", j, v)
		}
	}
}

func TestHadamardOrthogonal(t *testing.T) {
	// H is orthogonal, so rotating both operands of a dot product leaves it:
	// a·b = (aH)·(bH) since H·Hᵀ = I; here the norm |a|² = |aH|².
	a := make([]float32, 32)
	for i := range a {
		a[i] = float32(i%7) - 3
	}
	b := append([]float32(nil), a...)
	rht(b, 32, false)
	var da, db float64
	for i := range a {
		da += float64(a[i]) * float64(a[i])
		db += float64(b[i]) * float64(b[i])
	}
	if math.Abs(da-db) > 1e-4 {
		t.Errorf("|a|² = %v, |aH|² = %v", da, db)
	}
}

func TestStochasticMean(t *testing.T) {
	// Stochastic rounding is unbiased: 2.25 (a quarter of the way from 2
	// to 3) averages 2.25 over many draws; round-to-nearest gives 2.
	rng := NewRand(1)
	var sum float64
	const n = 20000
	for range n {
		sum += E2M1.RoundStochastic(2.25, rng.Float64())
	}
	if m := sum / n; math.Abs(m-2.25) > 0.02 {
		t.Errorf("mean of stochastic rounding of 2.25 = %v, want 2.25 ± 0.02", m)
	}
}

func TestLookup(t *testing.T) {
	if _, err := Lookup("fp8-delayed"); err == nil {
		t.Error("fp8-delayed: want refusal naming the amax history")
	}
	if _, err := Lookup("int4"); err == nil {
		t.Error("int4: want an error")
	}
	r, err := Lookup("nvfp4")
	if err != nil || !r.WeightGrad[0].Hadamard || r.Forward[0].Hadamard || !r.DataGrad[0].Stochastic || r.Forward[1].Rows != 16 {
		t.Errorf("nvfp4 = %+v, %v: want RHT only on the weight gradient, stochastic gradients, 16×16 weight blocks", r, err)
	}
}
