package cost

import (
	"math"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// Low-precision GEMMs. A recipe that converts a GEMM (job.Recipe.Converts)
// runs it on fp8 operands at the device's FP8 peak (MX peak for mxfp8, FP4
// peak for nvfp4) times the device's measured FP8 GEMM efficiency, with the
// same tile and wave model as bf16 and operands of one byte (the output
// stays bf16), and quantizes its bf16 operands first. The quantize kernels
// are memory-bound passes priced per tensor, at the device's CastEff of HBM
// bandwidth (castBytes gives the bytes per element of each recipe):
//
//	torchao (fp8-tensorwise, fp8-rowwise, mxfp8; torchtitan's converters):
//	  each GEMM casts its two operands in the layout it needs, forward x
//	  and w, data gradient g and wᵀ, weight gradient gᵀ and xᵀ (torchao
//	  saves the bf16 x and w for backward and casts again: float8_linear.py
//	  matmul_with_hp_or_float8_args, mx_formats' mx_mm): read 2 bytes,
//	  write 1 per element, plus for tensorwise and rowwise an amax pass
//	  reading the tensor first (the scale of the whole tensor, or of each
//	  row, must be known before the cast: torchao's hp_tensor_to_float8_dynamic
//	  computes it apart; a row's FP32 scale is 4 bytes per row, not
//	  counted), and for MX an e8m0 scale per 32 elements. MX grouped GEMMs
//	  also rearrange the activations' scales per group into the blocked
//	  layout the kernel reads (torchao's triton_mx_block_rearrange_2d_M_groups),
//	  a kernel bound by its rows (MXSwizzleSPerRow). fp8-rowwise with
//	  Recipe.FP8RowwiseGWHP keeps the linears' weight gradients in bf16,
//	  with no casts (its data gradient casts w tensorwise: 5 bytes too).
//	TransformerEngine (fp8-current, fp8-delayed, fp8-blockwise, nvfp4;
//	  Megatron-Core): one fused cast-transpose per tensor writing the row-
//	  and column-wise copies together, x and w in forward and g in the data
//	  gradient; the weight gradient reuses them (TE saves the quantized
//	  copies for backward). Current scaling reads the tensor once more
//	  for its amax first (6 bytes per element); delayed scaling casts with
//	  the scale of the amax history and records the new amax in the same
//	  pass (4 bytes); blockwise computes each block's scale inside the cast
//	  (4 bytes, with an FP32 scale per 128 elements of x and g, per 128×128
//	  of w, in each copy: TransformerEngine d0067d0d
//	  transformer_engine/common/recipe/__init__.py Float8BlockScaling:
//	  "during the quantization both versions are computed from the high
//	  precision input").
//	TransformerEngine nvfp4 (NVFP4BlockScaling): the current-scaling
//	  passes, at the device's FP4 peak, with FP4 copies of half a byte plus
//	  an e4m3 scale per 16 elements (NVFP4Bytes); x and g are quantised
//	  column-wise after the random Hadamard transform, whose own amax pass
//	  reads them once more (TE computes the tensor scale from the rotated
//	  tensor: docs/features/low_precision_training/nvfp4/nvfp4.rst at
//	  d0067d0d, "Random Hadamard Transform"): 2 + 2 + 2·NVFP4Bytes bytes per
//	  element of w, 2 more for x and g. No NVFP4 GEMM efficiency was found
//	  published: the FP8 efficiencies are assumed.
//
// Rates: rowwise-scaled (CUTLASS), delayed-scaled (the same cuBLAS GEMM as
// current scaling: only the scale's origin differs) and block-scaled dense
// GEMMs run at the device's FP8 GEMM efficiency, an assumption for rowwise
// and blockwise (no published measurement of their dense GEMMs was found);
// blockwise grouped GEMMs at BlockwiseGroupedEff and BlockwiseWgradRatio,
// the one published measurement of a block-scaled grouped GEMM.
//
// Attention and the router stay bf16; linears with a dimension not a
// multiple of 16 are not converted (torchtitan's module_filter_fn: FP8
// tensor cores need it).
type LowPrecision struct {
	Recipe                  job.Precision
	Linear, Experts, Output bool    // the converted GEMM sets
	PeakFLOPs               float64 // dense FP8 (or MX) peak, FLOP/s
	GEMMEff, GroupedEff     float64 // fractions of PeakFLOPs (hw.Kernels' FP8GEMMEff, FP8GroupedEff)
	WgradRatio              float64 // grouped weight-gradient rate over GroupedEff
	CastEff                 float64 // fraction of HBM bandwidth the quantize kernels reach
	// WgradHP: the linears' weight-gradient GEMMs stay bf16
	// (job.Recipe.FP8RowwiseGWHP).
	WgradHP bool
	// FP8Gather: FSDP all-gathers the converted linears' weights already
	// cast (torchao's float8 all-gather, its scales precomputed after each
	// optimizer step), so forward casts no weight, and the data gradient
	// only transposes the fp8 weight (1 byte read, 1 written).
	FP8Gather bool
}

// MXSwizzleSPerRow is the time torchao's per-group MX scale rearrangement
// takes per row of a grouped GEMM's activations: 198.7 µs and 192.5 µs
// for 131072 rows (scales of 224 and 64 columns: the time follows the
// rows), on a B200 (pytorch/ao torchao/prototype/moe_training/README.md at
// 0b1bb117, 'MXFP8 Kernel Breakdown by Pass'); the same kernel is assumed
// on every MX device.
const MXSwizzleSPerRow = (198.7e-6 + 192.5e-6) / 2 / 131072

// BlockwiseGroupedEff and BlockwiseWgradRatio are a block-scaled FP8
// grouped GEMM's rate: DeepGEMM's 1×128 by 128×128 grouped GEMM ran the
// forward and data gradient at 1234 TFLOP/s (779.3 and 778.6 µs) and the
// weight gradient at 457 TFLOP/s on an H100 (FP8 peak 1979 TFLOP/s), with
// DeepSeek-V3's expert shapes at 4096 rows per group (pytorch/ao 36027d82
// benchmarks/prototype/blockwise_fp8_training/README.md, "H100 results";
// torchao's blockwise MoE backend). The asymptote takes out the grouped
// model's rows-per-group loss at the fallback GroupedHalfRows (406): 1234/1979
// × (4096 + 406)/4096. TransformerEngine's grouped GEMM for Float8BlockScaling
// is cuBLAS's, not DeepGEMM: no measurement of it was found, and this one
// is assumed on every device.
const (
	BlockwiseGroupedEff = 1234.0 / 1979 * (4096 + 406) / 4096
	BlockwiseWgradRatio = 457.0 / 1234
)

// NVFP4Bytes is the bytes of an NVFP4 element with its share of the block
// scale: half a byte of e2m1 and one e4m3 byte per 16 elements (the
// tensor's one FP32 scale is negligible).
const NVFP4Bytes = 0.5 + 1.0/16

// LowPrecisionFor is recipe r's low-precision GEMMs on device d: nil for
// bf16, an error naming device and recipe when d cannot run it (MX needs
// MX tensor-core formats).
func LowPrecisionFor(d hw.Device, r job.Recipe) (*LowPrecision, error) {
	if !r.Precision.LowPrecision() {
		return nil, nil
	}
	k := fallbackKernels
	if d.Kernels != nil {
		k = *d.Kernels
	}
	lp := &LowPrecision{Recipe: r.Precision, Linear: r.Converts(job.QuantLinear), Experts: r.Converts(job.QuantExperts),
		Output: r.Converts(job.QuantOutput), PeakFLOPs: d.FP8FLOPs, GEMMEff: k.FP8GEMMEff, GroupedEff: k.FP8GroupedEff,
		WgradRatio: k.FP8GroupedWgradRatio, CastEff: k.CastEff, WgradHP: r.FP8RowwiseGWHP}
	if err := d.Runs(r.Precision); err != nil {
		return nil, err
	}
	switch {
	case r.Precision.Microscaled():
		lp.PeakFLOPs = d.MXFP8FLOPs
	case r.Precision.FP4():
		lp.PeakFLOPs = d.FP4FLOPs
	}
	return lp, nil
}

// converts says whether op runs in low precision in pass.
func (lp *LowPrecision) converts(cfg *moe.Config, op moe.Op, pass moe.Pass) bool {
	if lp == nil || (lp.WgradHP && pass == moe.BackwardWeight && op.Kind() == moe.KindMatmul) {
		return false
	}
	switch op {
	case moe.OpRouter, moe.OpSharedExpGate:
		return false
	case moe.OpLMHead:
		return lp.Output && dims16(cfg, op)
	}
	switch op.Kind() {
	case moe.KindGrouped:
		return lp.Experts
	case moe.KindMatmul:
		return lp.Linear && dims16(cfg, op)
	}
	return false
}

func dims16(cfg *moe.Config, op moe.Op) bool {
	out, in, ok := weightShape(cfg, op)
	return ok && out%16 == 0 && in%16 == 0
}

// rate is what a GEMM runs at: the peak, the dense and grouped
// efficiencies (expert > 0: one cuBLAS GEMM per expert at it), the grouped
// weight gradient's ratio and the bytes of an operand element.
type rate struct {
	peak, gemm, grouped, expert, wgrad, operand float64
}

func (c ComputeSpec) bf16Rate() rate {
	return rate{c.PeakFLOPs, c.GEMMEff, c.GroupedEff, c.ExpertGEMMEff, 1, 2}
}

func (c ComputeSpec) lowRate() rate {
	lp := c.LowPrecision
	r := rate{lp.PeakFLOPs, lp.GEMMEff, lp.GroupedEff, 0, lp.WgradRatio, 1}
	if lp.Recipe.FP4() {
		r.operand = NVFP4Bytes
	}
	if lp.Recipe.Blockwise() {
		r.grouped, r.wgrad = BlockwiseGroupedEff, BlockwiseWgradRatio
	}
	if c.ExpertGEMMEff > 0 {
		r.expert, r.wgrad = lp.GEMMEff, 1
	}
	return r
}

// rateOf is the rate op runs at in pass.
func (c ComputeSpec) rateOf(cfg *moe.Config, op moe.Op, pass moe.Pass) rate {
	if c.LowPrecision.converts(cfg, op, pass) {
		return c.lowRate()
	}
	return c.bf16Rate()
}

// CastSeconds prices the quantize kernels of op record rec (zero for an
// op the recipe does not convert): rows·in activations, rows·out
// gradients and out·in weights per local expert (localExperts for grouped
// ops), by pass as LowPrecision's comment says.
func (c ComputeSpec) CastSeconds(cfg *moe.Config, rec moe.OpRecord, localExperts int) float64 {
	lp := c.LowPrecision
	if rec.Count <= 0 || !lp.converts(cfg, rec.Op, rec.Pass) {
		return 0
	}
	out, in, _ := weightShape(cfg, rec.Op)
	rows := float64(rec.Count / (out * in))
	x, g, w := rows*float64(in), rows*float64(out), float64(out*in)
	if rec.Op.Kind() == moe.KindGrouped {
		w *= float64(max(localExperts, 1))
	}
	act, weight, extra := lp.castBytes()
	var bytes, kernels float64
	if lp.Recipe.TEScaled() {
		perTensor := 2.0 // an amax pass and the cast
		if lp.Recipe == job.FP8Delayed || lp.Recipe.Blockwise() {
			perTensor = 1 // the cast alone
		}
		switch rec.Pass {
		case moe.Forward, moe.Recompute:
			bytes, kernels = act*x+weight*w+extra*x, 2*perTensor
		case moe.BackwardData:
			bytes, kernels = (act+extra)*g, perTensor
		default:
			return 0
		}
	} else {
		kernels = 4
		if lp.Recipe.Microscaled() {
			kernels = 2
		}
		wBytes := w * weight
		if lp.FP8Gather && rec.Op.Kind() == moe.KindMatmul {
			wBytes = 0 // gathered cast
			if rec.Pass == moe.BackwardData {
				wBytes = 2 * w // the fp8 weight transposed
			}
		}
		switch rec.Pass {
		case moe.BackwardData:
			bytes = g*act + wBytes
		case moe.BackwardWeight:
			bytes = (g + x) * act
		default:
			bytes = x*act + wBytes
		}
	}
	t := math.Max(bytes/(c.HBMBytesPerS*lp.CastEff), kernels*c.LaunchS)
	if lp.Recipe.Microscaled() && rec.Op.Kind() == moe.KindGrouped && rec.Pass != moe.BackwardWeight {
		t += rows * MXSwizzleSPerRow
	}
	return t
}

// castBytes is what the recipe's casts move per element of an activation
// or gradient and of a weight, and the extra amax read of the activations
// and gradients NVFP4's Hadamard transform takes (LowPrecision's comment).
func (lp *LowPrecision) castBytes() (act, weight, extra float64) {
	const blockScale = 4.0 / 128 // an FP32 scale per 1×128 block
	switch lp.Recipe {
	case job.FP8Current:
		return 6, 6, 0 // an amax read, 2 read, two 1-byte copies written
	case job.FP8Delayed:
		return 4, 4, 0 // 2 read, two 1-byte copies written
	case job.FP8Blockwise:
		return 2 + 2*(1+blockScale), 2 + 2*(1+blockScale/128), 0
	case job.NVFP4:
		return 4 + 2*NVFP4Bytes, 4 + 2*NVFP4Bytes, 2
	case job.MXFP8:
		return 3 + 1.0/32, 3 + 1.0/32, 0
	}
	return 5, 5, 0 // tensorwise, rowwise: an amax read of 2 bytes, then 2 read and 1 written
}
