package memory

import "github.com/moescope/moescope/moe"

// Compile says which parts of the step torch.compile compiles, as
// torchtitan's compile.components does ("model", "loss"; both by default
// since bbb1b616e, 2025-04-02; before it the loss stayed eager: its
// compile was commented out with "compiling loss function causes CUDA
// errors", d1f62be, 2025-02-20). The zero value is eager.
type Compile struct {
	// Model compiles the decoder blocks as torchtitan's apply_compile does
	// (torchtitan v0.2.2 73a0e69, models/llama4/infra/parallelize.py
	// apply_compile): a dense block whole; a MoE block submodule by
	// submodule (norms, attention, router, shared experts), its routed
	// experts staying eager ("We don't compile token dispatch and token
	// combine", the `continue` on "experts"). Embedding, final norm and LM
	// head are never compiled.
	Model bool `json:"model"`
	// Loss compiles the cross-entropy (torchtitan's build_cross_entropy_loss
	// wraps it in torch.compile).
	Loss bool `json:"loss"`
}

// Compiled is torchtitan's --compile: model and loss.
var Compiled = Compile{Model: true, Loss: true}

// compiledBlock returns a block's saved-tensor records (rs, the eager
// table of policy ac for layer) without those a compiled block does not
// keep. Inductor fuses element-wise chains into their consumers, and
// AOTAutograd's min-cut partitioner (torch/_functorch/partitioners.py,
// min_cut_rematerialization_partition) saves only forward values the
// backward graph reads, recomputing fusible element-wise ops from them:
//
//   - SwiGLU (dense MLP, in a whole-block graph; shared experts, a compiled
//     submodule): silu(gate) and silu(gate)·up, the down projection's
//     input, are recomputed from the saved gate and up. The routed experts
//     are eager and keep theirs.
//   - QK-norm with RoPE inside the compiled attention: the normalized,
//     rotated q and k that SDPA reads are recomputed from the q/k norms'
//     inputs and rstd.
//   - MLA's latent RMSNorms sit inside the compiled attention (dense and
//     MoE blocks alike): their outputs, the q_b_proj and kv_b_proj inputs,
//     are recomputed from the norms' inputs and rstd, as QK-norm's are.
//   - RMSNorm outputs inside a whole-block graph (dense blocks): the
//     q_proj (MLA: q_proj or q_a_proj) and MLP inputs are recomputed from
//     the norms' inputs and rstd.
//     In MoE blocks each norm is its own graph, so its output is the next
//     graph's input and stays saved.
//   - Selective AC over a whole-block graph (dense blocks): the policy's
//     MUST_SAVE marks bound recomputation, but a marked output the backward
//     never reads is not saved: the down projection's output feeds only the
//     residual add, whose gradient reads no values. Eager SAC caches it.
//
// Blocks that are fully checkpointed keep their input alone either way.
func compiledBlock(cfg *moe.Config, layer int, ac moe.AC, rs []moe.SavedRecord) []moe.SavedRecord {
	if ac.FullyCheckpointed(layer) {
		return rs
	}
	dense := !cfg.MoELayer[layer]
	type key struct {
		op     moe.Op
		tensor moe.Saved
	}
	drop := map[key]bool{}
	add := func(op moe.Op, tensor moe.Saved) { drop[key{op, tensor}] = true }
	switch ac.Mode {
	case moe.ACSelective:
		if dense {
			add(moe.OpDenseDown, moe.SavedOutput)
		}
	default:
		add(moe.OpSharedAct, moe.SavedSiLUGate)
		add(moe.OpSharedDown, moe.SavedInput)
		if cfg.QKNorm != moe.QKNormNone {
			add(moe.OpAttn, moe.SavedQ)
			add(moe.OpAttn, moe.SavedK)
		}
		if cfg.IsMLA() {
			add(moe.OpQBProj, moe.SavedInput)
			add(moe.OpKVBProj, moe.SavedInput)
		}
		if dense {
			add(moe.OpDenseAct, moe.SavedSiLUGate)
			add(moe.OpDenseDown, moe.SavedInput)
			add(moe.OpQProj, moe.SavedInput)
			add(moe.OpQAProj, moe.SavedInput)
			add(moe.OpDenseGate, moe.SavedInput)
		}
	}
	out := rs[:0:0]
	for _, r := range rs {
		if !drop[key{r.Op, r.Tensor}] {
			out = append(out, r)
		}
	}
	return out
}

// compiledLoss replaces, in the head's records, the log-probabilities an
// eager cross-entropy saves by what a compiled one saves: its input, the
// logits in the activation type (the fp32 upcast is fused into the
// reduction and into the backward kernel), and the log-sum-exp per token
// (fp32).
func compiledLoss(rs []moe.SavedRecord, tokens int64, act moe.DType) []moe.SavedRecord {
	out := rs[:0:0]
	for _, r := range rs {
		if r.Op == moe.OpLoss && r.Tensor == moe.SavedLogProbs {
			out = append(out,
				moe.SavedRecord{Layer: r.Layer, Op: moe.OpLoss, Tensor: moe.SavedLogits, Elements: r.Elements, DType: act},
				moe.SavedRecord{Layer: r.Layer, Op: moe.OpLoss, Tensor: moe.SavedLSE, Elements: tokens, DType: moe.F32})
			continue
		}
		out = append(out, r)
	}
	return out
}
