package cost

import (
	"math"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// Low-precision GEMMs. A recipe that converts a GEMM (job.Recipe.Converts)
// runs it on fp8 operands at the device's FP8 peak (MX peak for mxfp8)
// times the device's measured FP8 GEMM efficiency, with the same tile and
// wave model as bf16 and operands of one byte (the output stays bf16), and
// quantizes its bf16 operands first. The quantize kernels are memory-bound
// passes priced per tensor, at the device's CastEff of HBM bandwidth:
//
//	torchao (fp8-tensorwise, mxfp8; torchtitan's converters): each GEMM
//	  casts its two operands in the layout it needs, forward x and w,
//	  data gradient g and wᵀ, weight gradient gᵀ and xᵀ (torchao saves the
//	  bf16 x and w for backward and casts again: float8_linear.py
//	  matmul_with_hp_or_float8_args, mx_formats' mx_mm): read 2 bytes,
//	  write 1 per element, plus for tensorwise an amax pass reading the
//	  tensor first (its one scale must be known before the cast), and for
//	  MX an e8m0 scale per 32 elements. MX grouped GEMMs also rearrange
//	  the activations' scales per group into the blocked layout the
//	  kernel reads (torchao's triton_mx_block_rearrange_2d_M_groups), a
//	  kernel bound by its rows (MXSwizzleSPerRow).
//	TransformerEngine (fp8-current, Megatron-Core): one amax pass and one
//	  fused cast-transpose per tensor, writing the row- and column-wise
//	  copies together (6 bytes per element), x and w in forward and g in
//	  the data gradient; the weight gradient reuses them (TE saves the
//	  fp8 copies for backward).
//	TransformerEngine nvfp4 (NVFP4BlockScaling): the same passes, at the
//	  device's FP4 peak, with FP4 copies of half a byte plus an e4m3 scale
//	  per 16 elements (NVFP4Bytes); x and g are quantised column-wise after
//	  the random Hadamard transform, whose own amax pass reads them once
//	  more (TE computes the tensor scale from the rotated tensor:
//	  docs/features/low_precision_training/nvfp4/nvfp4.rst at d0067d0d,
//	  "Random Hadamard Transform"): 2 + 2 + 2·NVFP4Bytes bytes per element
//	  of w, 2 more for x and g. No NVFP4 GEMM efficiency was found
//	  published: the FP8 efficiencies are assumed.
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
		WgradRatio: k.FP8GroupedWgradRatio, CastEff: k.CastEff}
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

// converts says whether op runs in low precision.
func (lp *LowPrecision) converts(cfg *moe.Config, op moe.Op) bool {
	if lp == nil {
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
	if c.ExpertGEMMEff > 0 {
		r.expert, r.wgrad = lp.GEMMEff, 1
	}
	return r
}

// rateOf is the rate op runs at.
func (c ComputeSpec) rateOf(cfg *moe.Config, op moe.Op) rate {
	if c.LowPrecision.converts(cfg, op) {
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
	if rec.Count <= 0 || !lp.converts(cfg, rec.Op) {
		return 0
	}
	out, in, _ := weightShape(cfg, rec.Op)
	rows := float64(rec.Count / (out * in))
	x, g, w := rows*float64(in), rows*float64(out), float64(out*in)
	if rec.Op.Kind() == moe.KindGrouped {
		w *= float64(max(localExperts, 1))
	}
	var bytes, kernels float64
	if lp.Recipe == job.FP8Current || lp.Recipe.FP4() {
		per, rht := 6.0, 0.0 // an amax read, 2 read, two 1-byte copies written
		if lp.Recipe.FP4() {
			per, rht = 4+2*NVFP4Bytes, 2
		}
		switch rec.Pass {
		case moe.Forward, moe.Recompute:
			bytes, kernels = per*(x+w)+rht*x, 4
		case moe.BackwardData:
			bytes, kernels = (per+rht)*g, 2
		default:
			return 0
		}
	} else {
		per := 5.0 // tensorwise: an amax read of 2 bytes, then 2 read and 1 written
		kernels = 4
		if lp.Recipe.Microscaled() {
			per, kernels = 3+1.0/32, 2
		}
		wBytes := w * per
		if lp.FP8Gather && rec.Op.Kind() == moe.KindMatmul {
			wBytes = 0 // gathered cast
			if rec.Pass == moe.BackwardData {
				wBytes = 2 * w // the fp8 weight transposed
			}
		}
		switch rec.Pass {
		case moe.BackwardData:
			bytes = g*per + wBytes
		case moe.BackwardWeight:
			bytes = (g + x) * per
		default:
			bytes = x*per + wBytes
		}
	}
	t := math.Max(bytes/(c.HBMBytesPerS*lp.CastEff), kernels*c.LaunchS)
	if lp.Recipe.Microscaled() && rec.Op.Kind() == moe.KindGrouped && rec.Pass != moe.BackwardWeight {
		t += rows * MXSwizzleSPerRow
	}
	return t
}
