// Package flops counts parameters and floating-point work of a moe.Config
// exactly, with int64 arithmetic that reports overflow as an error.
//
// Three layers of results:
//   - Params: total and active parameter counts, by moe.ParamGroup.
//   - Ops: the per-layer, per-op, per-pass table in moe's op vocabulary
//     (moe/ops.go), the analytic twin of what the reference implementation
//     records; matmul FLOPs are 2·Count of matmul, grouped and attention ops.
//   - Conventions: FLOPs per step and per token as torchtitan, Megatron-LM,
//     PaLM, moescope's model count and the hardware count define them, and
//     the MFU/HFU helpers that divide by a peak given as an argument.
//
// Units: counts are multiply-adds (Count) or elements; FLOPs are 2 per
// multiply-add; per-step figures are integers, per-token ones float64.
//
// It imports only moe, and never memory (the two accountings stay
// independent); parallel and everything above import it.
package flops
