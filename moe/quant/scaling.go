package quant

import (
	"math"
	"math/rand/v2"
)

// Rule is how a block's scale follows from its largest magnitude amax.
type Rule int

const (
	// AmaxFP32 scales by Max/amax in float32 (torchao's amax_to_scale,
	// pytorch/ao 36027d82 torchao/float8/float8_utils.py, amax clamped to
	// EPS = 1e-12; TransformerEngine's current scaling, Float8CurrentScaling
	// without power-of-two scales).
	AmaxFP32 Rule = iota
	// AmaxPow2 is AmaxFP32's scale rounded down to a power of two
	// (torchao's _round_scale_down_to_power_of_2, same file; TE's
	// Float8BlockScaling default power_2_scale, NVIDIA/TransformerEngine
	// d0067d0d transformer_engine/common/recipe/__init__.py).
	AmaxPow2
	// MXE8M0 is the MX spec's shared E8M0 scale (MXScale).
	MXE8M0
	// NVFP4 is NVIDIA's two-level scale: an FP32 tensor scale s_global =
	// amax_tensor/(448·6) and per block an E4M3 scale s_block =
	// (amax_block/6)/s_global, as TransformerEngine's reference quantiser
	// computes them (d0067d0d transformer_engine/pytorch/custom_recipes/
	// reference_nvfp4.py, _quantize_blockwise_reference).
	NVFP4
)

// Scaling is how one GEMM operand is quantised: its element format, the
// scale rule and the block a scale covers, Cols elements along the GEMM's
// contraction axis (0: the whole axis) by Rows across it (0: all of them).
// Tensorwise is {0, 0}, rowwise {0, 1}, 1×128 {128, 1}, 128×128 {128, 128},
// MX {32, 1}, NVFP4 {16, 1} or {16, 16}. Hadamard first rotates every 16
// consecutive elements along the contraction axis by NVIDIA's random
// Hadamard transform (RHT); Stochastic rounds elements stochastically. The
// zero Scaling keeps the operand in high precision.
type Scaling struct {
	Elem       Format
	Rule       Rule
	Cols, Rows int
	Hadamard   bool
	Stochastic bool
}

// HighPrecision says the operand is not quantised.
func (s Scaling) HighPrecision() bool { return s.Elem.Name == "" }

// Axis is the axis of a row-major operand its GEMM contracts over.
type Axis int

const (
	AlongCols Axis = iota // each row is one contraction vector (x of x·Wᵀ)
	AlongRows             // each column is (W of dy·W, both operands of dyᵀ·x)
)

// Apply writes to dst the fake-quantised src, a rows×cols row-major operand
// whose GEMM contracts along axis: every value scaled, rounded to Elem and
// scaled back, so that dst holds exactly the values the low-precision GEMM
// multiplies. rng feeds stochastic rounding (unused otherwise). A block
// whose amax is NaN or infinite comes back NaN (MX: the NaN scale).
func (s Scaling) Apply(dst, src []float32, rows, cols int, axis Axis, rng *rand.Rand) {
	if len(src) != rows*cols || len(dst) != rows*cols {
		panic("quant: operand length is not rows×cols")
	}
	if s.HighPrecision() {
		copy(dst, src)
		return
	}
	if axis == AlongRows {
		t := make([]float32, len(src))
		transpose(t, src, rows, cols)
		s.apply(t, cols, rows, rng)
		transpose(dst, t, cols, rows)
		return
	}
	copy(dst, src)
	s.apply(dst, rows, cols, rng)
}

// apply quantises a in place, contraction along its rows' elements. The
// Hadamard transform needs rows of a multiple of 16: shorter ones are
// padded with zeros, as Megatron-LM pads each expert's tokens for FP8/FP4
// (moe_router_padding_for_quantization, Megatron-LM d98e8a64
// megatron/core/transformer/transformer_config.py), and the pad is dropped
// after.
func (s Scaling) apply(a []float32, rows, cols int, rng *rand.Rand) {
	if s.Hadamard && cols%16 != 0 {
		pc := (cols + 15) / 16 * 16
		p := make([]float32, rows*pc)
		for r := range rows {
			copy(p[r*pc:], a[r*cols:(r+1)*cols])
		}
		s.apply(p, rows, pc, rng)
		for r := range rows {
			copy(a[r*cols:(r+1)*cols], p[r*pc:])
		}
		return
	}
	if s.Hadamard {
		rht(a, cols, false)
	}
	var g global
	if s.Rule == NVFP4 {
		g = newGlobal(amax(a, rows, cols, 0, 0, rows, cols))
	}
	bc, br := s.Cols, s.Rows
	if bc == 0 {
		bc = cols
	}
	if br == 0 {
		br = rows
	}
	for r0 := 0; r0 < rows; r0 += br {
		for c0 := 0; c0 < cols; c0 += bc {
			r1, c1 := min(r0+br, rows), min(c0+bc, cols)
			b := s.block(amax(a, rows, cols, r0, c0, r1, c1), g)
			for r := r0; r < r1; r++ {
				row := a[r*cols+c0 : r*cols+c1]
				for i, v := range row {
					row[i] = b.quantise(s, v, rng)
				}
			}
		}
	}
	if s.Hadamard {
		rht(a, cols, true)
	}
}

func amax(a []float32, _, cols, r0, c0, r1, c1 int) float64 {
	var m float32
	for r := r0; r < r1; r++ {
		for _, v := range a[r*cols+c0 : r*cols+c1] {
			if v != v || math.IsInf(float64(v), 0) {
				return math.NaN()
			}
			m = max(m, float32(math.Abs(float64(v))))
		}
	}
	return float64(m)
}

func transpose(dst, src []float32, rows, cols int) {
	for r := range rows {
		for c := range cols {
			dst[c*rows+r] = src[r*cols+c]
		}
	}
}
