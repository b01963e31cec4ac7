package cost

import "github.com/moescope/moescope/moe"

// BytesPerElement is the HBM traffic per counted element of a memory-bound
// op: element size × accesses (reads + writes). Activations are bf16.
// Compiled, Inductor fuses the chain of elementwise ops between two matmuls
// into one kernel whose intermediates stay in registers: per op of the
// chain one read and one write (2 accesses) forward, and 3 backward (input
// and output gradient read, input gradient written; the statistic
// recomputed in the kernel); worked out from what the fused kernel must
// move, not measured. In eager PyTorch each op is its own kernel (or
// several): eagerBytes. The loss works on fp32 logits (torchtitan upcasts
// before cross-entropy); AdamW reads parameter, gradient and both moments
// and writes parameter and moments, all fp32: 7 × 4 = 28 bytes per
// parameter (fused AdamW, one pass, either way). Gathers and scatters read
// a row and write a row.
func (c ComputeSpec) BytesPerElement(op moe.Op, pass moe.Pass) float64 {
	backward := pass == moe.BackwardData || pass == moe.BackwardWeight
	switch op {
	case moe.OpOptimizer:
		return 28
	case moe.OpEmbed, moe.OpDispatch, moe.OpCombine:
		return 2 * 2
	}
	if !c.Compiled && !c.FusedElementwise {
		if b, ok := eagerBytes(op, pass, c.CompositeNorm); ok {
			return b
		}
	}
	acc := 3.0
	if backward {
		acc = 4
	}
	if c.Compiled {
		acc--
	}
	if op == moe.OpLoss {
		return 4 * acc
	}
	return 2 * acc
}

// eagerBytes is the HBM traffic per counted element of the ops that eager
// PyTorch runs as several kernels, each reading and writing its whole
// tensor, counted kernel by kernel from the code that runs (b = bf16 read
// or write of 2 bytes, f = fp32 of 4; per-row statistics and broadcast
// operands are negligible). ok is false for an op of one kernel each way,
// which the generic rule of BytesPerElement prices.
//
//	RMSNorm, composite (PyTorch before 2.9: at::rms_norm in
//	  aten/src/ATen/native/layer_norm.cpp is CompositeImplicitAutograd:
//	  input.to(float), pow, mean, mul by rsqrt, mul by weight, type_as):
//	  forward bf+ff+f+ff+ff+fb = 40; backward through autograd, the data
//	  path bf (type_as) + ff (× weight) + ff (× rsqrt) + ff+f (the mean's
//	  gradient through pow) + fff (sum of the two paths) + fb (to bf16) +
//	  ff+f (the rsqrt path's row sums) = 64 and the weight gradient fff+f
//	  (product with the saved normalized input, then the sum over rows) =
//	  16. PyTorch 2.9 runs aten._fused_rms_norm (pytorch/pytorch PR
//	  #153666, in nightlies from August 2025 per pytorch issue #157345),
//	  one kernel each way: the generic rule.
//	RoPE: torchtitan's Llama 3 apply_rotary_emb upcasts and multiplies in
//	  complex fp32 (float(), view_as_complex, × freqs_cis, view_as_real,
//	  type_as): bf+ff+fb = 20 forward, and its autograd the same three
//	  kernels backward, 20; torchtitan's Qwen3 rotate_half form (x·cos,
//	  neg and cat of the halves, ·sin, add, in bf16) moves bb+½bb+bb+bb+
//	  bbb = 20 as well.
//	SwiGLU (silu(x·W1)·(x·W3), the dense, shared and routed experts'):
//	  silu bb + mul bbb = 10 forward; backward the product rule's two
//	  muls bbb + bbb and silu's backward bbb = 18.
//	cross-entropy on upcast logits (torchtitan's cross_entropy_loss,
//	  F.cross_entropy(pred.float())): forward bf + log_softmax ff = 14
//	  bytes per logit; backward nll_loss's zero-filled gradient f, the
//	  log_softmax backward fff and the cast back fb: f+fff+fb = 22.
func eagerBytes(op moe.Op, pass moe.Pass, compositeNorm bool) (float64, bool) {
	backward := pass == moe.BackwardData || pass == moe.BackwardWeight
	switch op {
	case moe.OpAttnNorm, moe.OpFFNNorm, moe.OpFinalNorm, moe.OpQNorm, moe.OpKNorm, moe.OpQANorm, moe.OpKVANorm:
		if !compositeNorm {
			return 0, false
		}
		switch pass {
		case moe.BackwardData:
			return 64, true
		case moe.BackwardWeight:
			return 16, true
		}
		return 40, true
	case moe.OpRoPE:
		return 20, true
	case moe.OpDenseAct, moe.OpExpertAct, moe.OpSharedAct:
		if backward {
			return 18, true
		}
		return 10, true
	case moe.OpLoss:
		if backward {
			return 22, true
		}
		return 14, true
	}
	return 0, false
}
