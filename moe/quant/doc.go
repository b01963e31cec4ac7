// Package quant fake-quantises float32 tensors the way low-precision
// training recipes quantise GEMM operands: each value is scaled, rounded to
// a narrow floating-point format and scaled back, so that a float32 GEMM of
// the results equals the recipe's low-precision GEMM up to the order of
// accumulation.
//
//   - Format: the element formats, rounded to nearest with ties to even (or
//     stochastically), subnormals included: OCP FP8 E4M3 and E5M2 ("OCP 8-bit
//     Floating Point Specification (OFP8)", revision 1.0, 2023-06-20) and
//     the OCP Microscaling Formats (MX) Specification v1.0 (2023-09) FP4
//     E2M1; E8M0 is the MX spec's shared power-of-two scale.
//   - Scaling: how one operand is scaled: one amax scale per tensor, per row,
//     per 1×128 or 128×128 block, MX blocks of 32 with E8M0 scales, or
//     NVFP4's 16-element blocks with E4M3 scales under an FP32 tensor scale
//     (optionally after a 16-point random Hadamard transform).
//   - Recipe: the Scaling of each operand of a linear layer's three GEMMs
//     (forward, data gradient, weight gradient) under a training recipe, as
//     torchao and TransformerEngine define it at pinned commits.
//
// The package knows no model: it works on row-major matrices whose rows run
// along the GEMM's contraction dimension.
package quant
