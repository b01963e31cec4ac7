// Package ref is the reference implementation of the models that package
// moe describes: forward, backward and AdamW on the CPU in float32 or float64,
// with Hugging Face semantics, reporting every op it runs and every tensor
// it keeps for backward to a moe.Recorder under the rules of moe's ops.go
// and saved.go (the flops and memory tests check the records against the
// analytic tables exactly).
//
// Model[T] (T float32 or float64) holds the parameters flat in
// moe.Config.Params order and runs ForwardBackward on a micro-batch of token
// ids (Options: AC, Recorder, BF16, AuxCoef, attention tile), accumulating
// gradients (scale 1/micro-batches for accumulation; Accumulate does it)
// and per-expert loads; ForwardBackwardHF takes Hugging Face's input
// convention instead (every id an input) for the loss HF trains on
// (HFAuxCoef); Step applies torch.optim.AdamW. Its semantics are Hugging
// Face's Qwen3MoeForCausalLM and the variants moe.Config allows (see Routing,
// RMSNorm in norm.go, RoPE's tables in package moe/ref/rope, flash
// attention in package moe/attn, multi-head latent attention in moe/mla.go
// and mla_block.go, GPT-OSS's attention sinks in moe/attn/sinks.go and its
// biased, fused experts under the clamped SwiGLU in gptoss_experts.go and
// gptoss_swiglu.go).
//
// The execution seam for parallel ranks is the Block: one decoder layer
// run by Forward(weights, x) and Backward(weights, grads, dy, auxGrad) with
// LayerWeights the caller may have all-gathered, and checkpointing done
// inside the block. Inside an MoE block the order is router → Routing
// (indices, weights, per-expert Counts, Order) → dispatch (rows in expert
// order) → ExpertStage → combine; an expert-parallel rank sets
// Block.Experts to a stage that exchanges rows by all-to-all with the real
// counts, runs its local experts and returns rows in the same order.
//
// Tensor parallelism with sequence parallelism runs the same Block over a
// group's ranks (Block.ForwardSP and BackwardSP through a TPComm, the
// weights split by TPShard, the shapes of TPLocal; Head.ForwardTP and
// Embedding.ForwardShard for the vocabulary-sharded ends).
//
// # Why a package of its own
//
// Package moe is the description that flops, memory and the planner count
// from: Config, the op and saved-tensor vocabulary, the checkpointing
// policies and the analytic table of what each op keeps. Executing it takes
// twice that code again (blocks, routing, expert GEMMs, RoPE, the loss, the
// optimizer, tensor parallelism) over the CPU kernels and their assembly,
// none of which the analytic packages need. The execution reads the
// description and the description never reads the execution, so the cut
// follows that one-way dependency: ref imports moe and nothing in moe
// imports ref. The one internal of moe exported for it is AC.Cached, what
// the selective and memory-budget policies keep of a block, which
// moe.SavedTensors lists and Block caches. A cut inside the execution
// would export the Block's forward state and steps instead: the
// tensor-parallel block and MLA's attention are methods of the one Block,
// reading its state between the other steps.
// Everything that knows a tensor-parallel degree or a rank's piece of a
// tensor is here, beside the Block it runs, so moe knows no ranks.
//
// Shape legend as package moe's: T tokens, D model (hidden) dim, F expert
// FFN dim, E routed experts, K top-k, H query heads, G KV heads, d head
// dim, V vocabulary, L layers, B sequences of a micro-batch; xTKD is
// [T·K, D], the dispatched rows.
package ref
