package memory

import "github.com/moescope/moescope/moe"

// TE says which parts of the step are TransformerEngine's, as Megatron-Core
// builds them (job.Recipe.TransformerImpl and LossImpl), and how its
// modules store the inputs they save. The zero value is torchtitan's
// PyTorch modules throughout.
type TE struct {
	// Blocks: Megatron-Core's TE layer spec (teBlock).
	Blocks bool `json:"blocks,omitempty"`
	// Loss: TransformerEngine's parallel_cross_entropy (teLoss).
	Loss bool `json:"loss,omitempty"`
	// Linear and Experts: the recipe converts the linear (attention
	// projections, dense and shared FFNs) and routed-expert GEMM sets, whose
	// TE modules save their inputs quantized, one byte per element; MX adds
	// MXFP8's E8M0 scale per 32 elements (a per-tensor recipe's one scale
	// is not counted); FP4 (NVFP4) saves them as packed e2m1 pairs, one
	// byte per two elements (TE's fp4x2 data, NVFP4Tensor), with an E4M3
	// scale per 16 elements; Block (fp8-blockwise, TE's Float8BlockScaling)
	// adds an FP32 scale per 128 elements (the column-wise copy's 1×128
	// blocks of an activation or gradient: blockScaleElems).
	Linear, Experts, MX, FP4, Block bool
}

// blockScaleElems is the elements one FP32 scale of TransformerEngine's
// Float8BlockScaling covers in an activation (x_block_scaling_dim = 1:
// 1×128 blocks; transformer_engine/common/recipe/__init__.py at d0067d0d).
const blockScaleElems = 128

// mxBlock is the elements one MXFP8 scale covers (OCP Microscaling v1.0).
const mxBlock = 32

// nvfp4Block is the elements one NVFP4 block scale covers
// (TransformerEngine's NVFP4BlockScaling, 1×16).
const nvfp4Block = 16

// teBlock returns a block's saved-tensor records (rs, torchtitan's eager
// table of policy ac for layer) as Megatron-Core's TransformerEngine layer
// spec keeps them, read at Megatron-LM 0d8e0714cd29c01e164fe6de9f532182bdffa942
// and TransformerEngine v2.9 (70f536662ae10a62a54f4ed1ba92e3314c5cfd69):
//
//   - SwiGLU is one fused function that saves its input alone, the gate
//     and up projections' output (megatron/core/fusions/fused_bias_swiglu.py,
//     SwiGLUFunction and WeightedSwiGLUFunction: save_for_backward(input),
//     with the weights for the weighted one; bias_activation_fusion, on by
//     default in Megatron-LM's arguments (--no-bias-swiglu-fusion turns it
//     off) and in Megatron-Bridge's model providers): silu(gate) is not
//     kept, in dense MLPs, shared experts and routed experts alike.
//   - Routed experts apply the routing probabilities in their activation
//     (megatron/core/transformer/moe/experts.py, TEGroupedMLP.forward:
//     weighted_bias_swiglu_impl(…, permuted_probs, …) before linear_fc2),
//     and the combine unpermutes without merging probabilities
//     (token_dispatcher.py, unpermute(…) with no probs), which saves its
//     row map only: the experts' output rows are not kept; the
//     probabilities are, by the weighted SwiGLU (the combine's weights
//     record becomes the activation's).
//   - Under a low-precision recipe, TE's Linear, LayerNormLinear and
//     GroupedLinear save the quantized input of each GEMM they convert,
//     column-wise data only (transformer_engine/pytorch/module/linear.py,
//     _Linear.forward: "Discard row-wise data since it is not needed in
//     backward pass", inputmat.update_usage(rowwise_usage=False,
//     columnwise_usage=True); layernorm_linear.py saves its quantized
//     ln_out; grouped_linear.py likewise): the normalized inputs of the
//     fused-norm linears, the down projections' inputs and the permuted
//     tokens take one byte per element. The output projection's input is
//     the attention output, which the attention keeps in bf16 too: its
//     quantized copy is one more record.
//
// Blocks that are fully checkpointed keep their input alone either way.
func teBlock(cfg *moe.Config, layer int, ac moe.AC, te TE, rs []moe.SavedRecord) []moe.SavedRecord {
	if ac.FullyCheckpointed(layer) {
		return rs
	}
	out := make([]moe.SavedRecord, 0, len(rs)+8)
	quantized := func(r moe.SavedRecord) {
		if te.FP4 {
			out = append(out, moe.SavedRecord{Layer: r.Layer, Op: r.Op, Tensor: r.Tensor, Elements: (r.Elements + 1) / 2, DType: moe.F8},
				moe.SavedRecord{Layer: r.Layer, Op: r.Op, Tensor: moe.SavedScales, Elements: (r.Elements + nvfp4Block - 1) / nvfp4Block, DType: moe.F8})
			return
		}
		out = append(out, moe.SavedRecord{Layer: r.Layer, Op: r.Op, Tensor: r.Tensor, Elements: r.Elements, DType: moe.F8})
		if te.MX {
			out = append(out, moe.SavedRecord{Layer: r.Layer, Op: r.Op, Tensor: moe.SavedScales,
				Elements: (r.Elements + mxBlock - 1) / mxBlock, DType: moe.E8M0})
		}
		if te.Block {
			out = append(out, moe.SavedRecord{Layer: r.Layer, Op: r.Op, Tensor: moe.SavedScales,
				Elements: (r.Elements + blockScaleElems - 1) / blockScaleElems, DType: moe.F32})
		}
	}
	for _, r := range rs {
		switch {
		case r.Tensor == moe.SavedSiLUGate && (r.Op == moe.OpDenseAct || r.Op == moe.OpSharedAct):
			continue
		case r.Op == moe.OpExpertAct || r.Op == moe.OpCombine:
			if r, keep := weightedExperts(r); keep {
				out = append(out, r)
			}
		case r.Tensor == moe.SavedInput && teConverts(te, r.Op):
			quantized(r)
		case r.Op == moe.OpAttn && r.Tensor == moe.SavedOutput:
			out = append(out, r)
			if te.Linear {
				quantized(moe.SavedRecord{Layer: r.Layer, Op: moe.OpOProj, Tensor: moe.SavedInput, Elements: r.Elements})
			}
		default:
			out = append(out, r)
		}
	}
	return out
}

// teConverts says whether op is a GEMM of a set te quantizes (the router
// stays bf16: it is not a TE module).
func teConverts(te TE, op moe.Op) bool {
	switch op {
	case moe.OpQProj, moe.OpKProj, moe.OpVProj, moe.OpOProj, moe.OpQAProj, moe.OpQBProj, moe.OpKVAProj, moe.OpKVBProj,
		moe.OpDenseGate, moe.OpDenseUp, moe.OpDenseDown, moe.OpSharedGate, moe.OpSharedUp, moe.OpSharedDown:
		return te.Linear
	case moe.OpExpertGate, moe.OpExpertUp, moe.OpExpertDown:
		return te.Experts
	}
	return false
}

// teLoss replaces, in the head's records, the log-probabilities an eager
// cross-entropy saves by what TransformerEngine's parallel_cross_entropy
// saves: the logits in the activation type, into which its forward has
// written the gradient (transformer_engine/pytorch/cross_entropy.py at
// v2.9, CrossEntropyFunction.forward: save_for_backward(_input) after
// triton cross_entropy_forward stores the gradient into X_ptr; backward
// scales it in place). Nothing else is kept, and backward allocates no
// gradient of the logits.
func teLoss(rs []moe.SavedRecord, act moe.DType) []moe.SavedRecord {
	out := rs[:0:0]
	for _, r := range rs {
		if r.Op == moe.OpLoss && r.Tensor == moe.SavedLogProbs {
			r.Tensor, r.DType = moe.SavedLogits, act
		}
		out = append(out, r)
	}
	return out
}

// teSavesLocal says whether TE keeps r, under tensor and sequence
// parallelism, as this rank's sequence shard where torchtitan's plan keeps
// the all-gathered tensor: a column-parallel linear's input, which TE's
// Linear and LayerNormLinear save before their all-gather and gather
// again in backward (TransformerEngine v2.9, layernorm_linear.py:
// ln_out_needs_gather = weight.requires_grad and parallel_mode == "column"
// and sequence_parallel, the saved ln_out being the local one; linear.py:
// backward_input_needs_gather likewise). Megatron-Core turns sequence
// parallelism on with tp under MoE (it requires it) and in the recipes of
// the published runs.
func teSavesLocal(r moe.SavedRecord) bool {
	if r.Tensor != moe.SavedInput && r.Tensor != moe.SavedScales {
		return false
	}
	switch r.Op {
	case moe.OpQProj, moe.OpKProj, moe.OpVProj, moe.OpQAProj, moe.OpKVAProj,
		moe.OpDenseGate, moe.OpDenseUp, moe.OpSharedGate, moe.OpSharedUp:
		return true
	}
	return false
}
