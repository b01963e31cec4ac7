package job

import (
	"slices"

	"github.com/moescope/moescope/moe"
)

// Precision is a training recipe (DESIGN's --precision contract).
type Precision string

// Training recipes.
const (
	BF16 Precision = "bf16"
	// FP8Tensorwise is torchao's float8 training with dynamic tensorwise
	// scaling (one scale per tensor from its current amax), torchtitan's
	// quantize.linear.float8 with recipe_name "tensorwise".
	FP8Tensorwise Precision = "fp8-tensorwise"
	// FP8Rowwise is torchao's float8 training with dynamic rowwise
	// (axiswise) scaling: one power-of-two scale per row of each operand
	// in the layout its GEMM reads, e4m3 throughout, CUTLASS rowwise GEMMs
	// (pytorch/ao 36027d82 torchao/float8/config.py, recipe "rowwise";
	// torchtitan's quantize.linear.float8 and quantize.grouped_mm.float8).
	// Recipe.FP8RowwiseGWHP is its "rowwise_with_gw_hp" variant.
	FP8Rowwise Precision = "fp8-rowwise"
	// MXFP8 is OCP Microscaling v1.0 FP8 (E4M3 elements, one E8M0 scale
	// per 32 consecutive elements), as torchao's MX training and
	// TransformerEngine's MXFP8BlockScaling implement it.
	MXFP8 Precision = "mxfp8"
	// FP8Delayed is TransformerEngine's DelayedScaling: tensorwise scales
	// from the largest amax of a history of amax_history_len (1024)
	// earlier steps, the current amax recorded by the cast itself, the
	// amaxes all-reduced (MAX) over the amax reduction group after each
	// forward and backward (TransformerEngine d0067d0d
	// transformer_engine/common/recipe/__init__.py DelayedScaling;
	// Megatron-LM's --fp8-recipe delayed).
	FP8Delayed Precision = "fp8-delayed"
	// FP8Current is TransformerEngine's Float8CurrentScaling: tensorwise
	// scales from each tensor's current amax, the recipe Megatron-LM's
	// --fp8-recipe tensorwise selects (megatron/core/enums.py Fp8Recipe).
	FP8Current Precision = "fp8-current"
	// FP8Blockwise is DeepSeek-V3's fine-grained FP8 as TransformerEngine's
	// Float8BlockScaling implements it: e4m3 with one FP32 (power-of-two)
	// scale per 1×128 block of activations and gradients and per 128×128
	// block of weights (TransformerEngine d0067d0d
	// transformer_engine/common/recipe/__init__.py Float8BlockScaling;
	// Megatron-LM's --fp8-recipe blockwise).
	FP8Blockwise Precision = "fp8-blockwise"
	// NVFP4 is NVIDIA's 4-bit recipe, TransformerEngine's
	// NVFP4BlockScaling (Megatron-LM's --fp4-recipe nvfp4): e2m1 elements
	// with an e4m3 scale per 16 and an FP32 tensor scale, 16×16 weight
	// blocks, a random Hadamard transform on the weight gradient's
	// operands and stochastic rounding of gradients (moe/quant).
	NVFP4 Precision = "nvfp4"
)

// Precisions are DESIGN's recipes; PricedPrecisions those the time and
// memory models price: all of them.
var (
	Precisions       = []Precision{BF16, FP8Tensorwise, FP8Rowwise, MXFP8, FP8Delayed, FP8Current, FP8Blockwise, NVFP4}
	PricedPrecisions = []Precision{BF16, FP8Tensorwise, FP8Rowwise, FP8Current, FP8Delayed, FP8Blockwise, MXFP8, NVFP4}
)

// Check accepts a priced recipe and refuses any other name with the list
// of priced ones. field names the flag or JSON key in the message.
func (p Precision) Check(field string) error {
	if slices.Contains(PricedPrecisions, p) {
		return nil
	}
	return moe.FieldError{Field: field, Value: string(p), Allowed: "unknown recipe (known and priced: " + joinValues(PricedPrecisions) + ")"}
}

// TEScaled says the recipe's casts are TransformerEngine's: one fused
// cast-transpose per tensor writing the row- and column-wise copies
// together, x and w in forward and g in the data gradient, reused by the
// weight gradient (fp8-current, fp8-delayed, fp8-blockwise, nvfp4).
func (p Precision) TEScaled() bool {
	return p == FP8Current || p == FP8Delayed || p == FP8Blockwise || p == NVFP4
}

// LowPrecision says the recipe runs GEMMs in a type narrower than bf16.
func (p Precision) LowPrecision() bool { return p != BF16 && p != "" }

// Microscaled says the recipe scales blocks of 32 elements (MX) rather
// than whole tensors: its GEMMs need the device's MX peak.
func (p Precision) Microscaled() bool { return p == MXFP8 }

// PricedNames lists PricedPrecisions' names (the command line's help).
func PricedNames() []string { return names(PricedPrecisions) }

// FP4 says the recipe's converted GEMMs run on FP4 operands (NVFP4: e2m1
// with an e4m3 scale per 16 elements and an FP32 tensor scale): they need
// the device's FP4 peak.
func (p Precision) FP4() bool { return p == NVFP4 }

// Blockwise says the recipe scales 1×128 and 128×128 blocks (fp8-blockwise):
// it needs TransformerEngine's FP8 block-scaled GEMMs (hw.Device.Runs).
func (p Precision) Blockwise() bool { return p == FP8Blockwise }

// Values lists the recipes (Recipe.Validate, the command line's help).
func (Precision) Values() []string { return names(Precisions) }

// GEMMSet names a group of a model's GEMMs that a low-precision recipe
// converts (DESIGN's --quantize).
type GEMMSet string

// GEMM sets. The router's gate stays bf16 under every recipe (torchtitan
// force-recomputes it and its few outputs make a narrow GEMM; Megatron
// keeps it in fp32).
const (
	// QuantLinear is every other linear layer: the attention projections
	// (MLA's included) and the dense and shared-expert FFNs.
	QuantLinear GEMMSet = "linear"
	// QuantExperts is the routed experts' grouped GEMMs.
	QuantExperts GEMMSet = "experts"
	// QuantAttention is the attention core itself (FP8 SDPA).
	QuantAttention GEMMSet = "attention"
	// QuantOutput is the output head.
	QuantOutput GEMMSet = "output"
)

// Values lists the GEMM sets.
func (GEMMSet) Values() []string {
	return names([]GEMMSet{QuantLinear, QuantExperts, QuantAttention, QuantOutput})
}

// Quantize lists the GEMM sets a recipe converts; empty = the framework's
// set for the recipe (DefaultQuantize).
type Quantize []GEMMSet

// DefaultQuantize is the set a recipe converts when none is named: what
// torchtitan converts with the recipe's converters at their defaults and
// the output head filtered (its float8 and MX train configs list
// filter_fqns = ["output"]), and what Megatron-Core converts under
// TransformerEngine (every TE linear and grouped linear; the output layer
// is not a TE module). fp8-tensorwise has no expert GEMMs: torchao has no
// tensorwise grouped GEMM (torchtitan's quantize.grouped_mm.float8 is
// rowwise, fp8-rowwise). fp8-rowwise converts both (torchtitan's
// quantize.linear.float8 and quantize.grouped_mm.float8 converters), and
// so do TransformerEngine's fp8-delayed, fp8-blockwise and nvfp4 under
// Megatron-Core. bf16 converts nothing.
func DefaultQuantize(p Precision) Quantize {
	switch p {
	case FP8Tensorwise:
		return Quantize{QuantLinear}
	case FP8Current, MXFP8, FP8Rowwise, FP8Delayed, FP8Blockwise, NVFP4:
		return Quantize{QuantLinear, QuantExperts}
	}
	return nil
}

func (q Quantize) check(p Precision) error {
	for i, s := range q {
		if err := checkEnum("quantize", s); err != nil {
			return err
		}
		if slices.Contains(q[:i], s) {
			return moe.FieldError{Field: "quantize", Value: string(s), Allowed: "each set once"}
		}
	}
	switch {
	case len(q) > 0 && !p.LowPrecision():
		return moe.FieldError{Field: "quantize", Value: q.String(), Allowed: "empty with precision bf16 (a low-precision recipe converts GEMMs)"}
	case slices.Contains(q, QuantAttention):
		return moe.FieldError{Field: "quantize", Value: q.String(), Allowed: "linear, experts and output (FP8 attention is not priced yet)"}
	case p == FP8Tensorwise && slices.Contains(q, QuantExperts):
		return moe.FieldError{Field: "quantize", Value: q.String(), Allowed: "linear and output with fp8-tensorwise (torchao has no tensorwise grouped GEMM; torchtitan's quantize.grouped_mm.float8 is rowwise: fp8-rowwise)"}
	}
	return nil
}

// GEMMSetOf is the GEMM set whose conversion makes parameter p a
// low-precision GEMM's weight: linear for a 2D weight of the attention,
// dense-FFN or shared-expert groups, output for the head's, experts for a
// routed expert's; false for everything else (norms, biases, embeddings,
// the router) and for a 2D weight with a dimension not a multiple of 16,
// which torchtitan's filter never converts (FP8 tensor cores need it).
func GEMMSetOf(p moe.Param) (GEMMSet, bool) {
	if p.Buffer || len(p.Shape) != 2 || p.Shape[0]%16 != 0 || p.Shape[1]%16 != 0 {
		return "", false
	}
	switch p.Group {
	case moe.GroupAttention, moe.GroupDenseFFN, moe.GroupShared:
		return QuantLinear, true
	case moe.GroupLMHead:
		return QuantOutput, true
	case moe.GroupRouted:
		return QuantExperts, true
	}
	return "", false
}

// String is the comma-separated list.
func (q Quantize) String() string { return joinValues(q) }
