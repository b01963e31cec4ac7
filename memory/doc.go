// Package memory accounts the memory of one GPU (rank) during a training
// step: training state, saved activations per checkpointing policy,
// transient buffers, the step's allocation timeline, and a model of the
// caching allocator that turns allocated into reserved bytes. It is pure:
// device capacity is an argument (see MaxLBS), and it never imports flops.
//
// # Training state
//
// Parameters are grouped into torchtitan's FSDP units (Units): the token
// embedding, each decoder block, the head (final norm + LM head). Per rank,
// Ψ_local = every non-expert element plus E/ep experts' share, and Ψ_shard =
// what FSDP2 stores after sharding over dp_shard (experts over dp_shard/ep),
// with torch.chunk padding. Under moe.DefaultPrecision (fp32 parameters,
// fp32 gradients, two fp32 AdamW moments) and fsdp, the state is
// 16·Ψ_shard bytes: ZeRO-3's (2+2+12)·Ψ/N_d up to padding and the split of
// those 16 bytes. Buffers (selection bias) are fp32, unsharded, untrained.
//
// # Event order of one step (the contract replayed by parallel's virtual-time backend)
//
// Every event names its stream: FSDP2 all-gather outputs are allocated on
// the all-gather stream, reduce-scatter outputs (which become the
// gradients) on the reduce-scatter stream, everything else on the compute
// stream. Saved and recomputed activations are one event per tensor
// (label "saved <op> <tensor>" / "recompute <op> <tensor>").
//
// Setup, per unit: stored parameters; then per unit the optimizer state;
// on a pipeline stage, every unit's gathered weights. Then for each
// micro-step m, walking the step's order (job.StepOrder, which says for
// each unit and pass whether its weights are gathered before the compute
// and freed after it, and whether its gradients are reduced):
//
// Forward, units in order (embedding, blocks 0..L-1, head), for unit u:
//  1. when the order gathers u: under fsdp the all-gather buffer of u
//     (first unit only; the others were prefetched), the copy-out into
//     u's unsharded weights (compute stream) and the free of the buffer;
//     non-fsdp with compute ≠ storage type, u's cast weights; then under
//     fsdp the prefetch of unit u+1's all-gather buffer when the order
//     gathers u+1;
//  2. u's saved tensors (Saved under the policy, compile and
//     TransformerEngine settings (te.go), the
//     head's without the vocabulary-sized ones when the loss is chunked);
//     for the head with an eager loss, the bf16 logits, their copy in the
//     loss type when it upcasts (fp32, torchtitan's pred.float()) and the
//     saved log-probabilities, then the frees of the copy and the logits
//     (torchtitan's `del pred`); with a compiled loss, the saved bf16 logits
//     and log-sum-exp only; with TransformerEngine's loss, the saved bf16
//     logits only; chunked: per chunk the same, all freed;
//  3. a block's forward workspace (its largest intermediate) and, with
//     ep > 1 on MoE blocks, the dispatch and combine all-to-all buffers;
//  4. the free of u's weights where the order reshards after forward.
//
// Backward, units in reverse, for unit u:
//  1. re-gather of u where the order gathers it (its buffer was
//     prefetched, or allocated here for the first unit of the backward),
//     and the prefetch of the next unit's when the order gathers it;
//  2. a block's recomputed tensors (those of the none policy that the
//     policy did not keep), the backward workspace (2 × largest
//     intermediate), all-to-all buffers; for the head, the loss gradients
//     (eager: nll_loss's and log_softmax's T×V gradients in the loss type,
//     then the activation-type cast when it upcast; compiled: the one bf16
//     gradient its fused backward writes; TransformerEngine's: none, its
//     forward wrote the gradient into the saved logits; chunked: per chunk, after
//     recomputing it);
//  3. the input gradient of u (T×D), freeing the previous one;
//  4. u's unsharded weight gradients (compute type), then the frees of
//     workspace, recomputed and saved tensors;
//  5. the free of the previous unit's reduce-scatter input (its collective
//     overlapped this unit's compute), u's reduce-scatter input (grad type,
//     Ψ_local of u, compute stream, as torch ≥ 2.6's foreach_reduce
//     allocates it), the free of the unsharded gradients, and on the first
//     micro-step u's reduced gradient (reduce-scatter stream; sharded under
//     fsdp and zero2);
//  6. the free of u's weights where the order frees them after backward
//     (FSDP2 reshards after backward; keep-gathered keeps them into the
//     next micro-step's forward, Megatron-FSDP its embedding and output
//     layer for the step).
//
// With grad-sync-last-only (FSDP2's set_requires_gradient_sync(False) on
// all but the last micro-step) and grad-accum > 1, steps 5 and 6 change
// before the last micro-step: nothing is reduced; in micro-step 0, u's
// weights are freed and its gradients upcast into the "accumulated_grads"
// it keeps (Ψ_local of u in the reduce type; when that is the compute type
// autograd's gradient is itself that allocation), in later ones the
// micro-step's unsharded gradients are added into it and freed, then the
// weights. In the last micro-step the unsharded gradients are freed into
// the accumulator, which step 5 then copies into the reduce-scatter input
// and frees (the free names micro-step 0, where it was allocated); the
// reduced gradients are allocated there, not in micro-step 0.
//
// After the last unit, the last reduce-scatter input is freed. Optimizer:
// with foreach AdamW the temporary sqrt(v) of every unit, then their frees
// (fused AdamW, torchtitan's default, has none); then zero_grad(set_to_none)
// frees the gradients. With allreduce-last-only, dp_replicate > 1 and
// grad-accum > 1, a partial reduce buffer (the sharded gradients' size,
// reduce-scatter stream) lives from the first micro-step's backward to the
// last's end.
//
// Replay walks the events: peak allocated is the maximum of live bytes
// (each request rounded to 512 B); peak reserved comes from simulating
// PyTorch's caching allocator over the same events (Allocator), with
// expandable or fixed segments (Segments).
//
// # Saved activations
//
// Saved lists, per layer and policy, the tensors kept for backward (see its
// doc for the table). The reference implementation in package moe/ref records
// what it saves through moe.Recorder; the exactness test compares the two.
//
// The host memory a rank of the CPU reference needs is package
// memory/host's, built on Estimate.
//
// It imports only moe, and never flops (the two accountings stay
// independent); parallel and everything above import it.
package memory
