package parallel

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// Tensor-parallel collectives (torchtitan v0.2.2, 73a0e69:
// models/qwen3/infra/parallelize.py apply_non_moe_tp and
// models/llama4/infra/parallelize.py apply_moe_ep_tp). With sequence
// parallelism a block's norms and residuals hold T/tp tokens per tp rank;
// the blocks' two column-parallel regions (q/k/v, and w1/w3 or the whole
// MoE module, whose input PrepareModuleInputOutput gathers) need all T
// tokens. Per block and micro-step, forward:
//
//	all-gather  T×D  attention_norm output → q/k/v    (Shard(1) → Replicate)
//	reduce-scatter T×D  o_proj partial sums → residual (Partial → Shard(1))
//	all-gather  T×D  ffn_norm output → w1/w3 or the MoE (router, experts)
//	reduce-scatter T×D  w2 (or MoE output) partial sums → residual
//
// Backward runs each one's adjoint in reverse order (the adjoint of an
// all-gather is a reduce-scatter of the input gradient and vice versa), all
// T×D. A fully checkpointed block re-runs its four forward collectives
// before its backward; under the selective policy torchtitan's SAC list
// saves reduce_scatter_tensor outputs but not all-gather outputs, so the
// two all-gathers re-run (PurposeTPRegather). The embedding is
// RowwiseParallel (vocabulary rows): its partial output is reduce-scattered
// forward (T×D) and its output gradient all-gathered backward. The head's
// LM head is ColwiseParallel from the sequence-parallel final norm: an
// all-gather forward and a reduce-scatter of the input gradient backward
// (T×D each); loss parallel (PyTorch torch/distributed/tensor/parallel/
// loss.py: _log_softmax and _nll_loss_forward on vocabulary-sharded logits)
// all-reduces three fp32 values per token forward (the max, the sum of
// exponentials, the target's logit) and nothing backward. T is the
// data-parallel rank's micro-batch tokens (lbs·seq), which the tp group
// shares; D the hidden size; the type the activation type. Expert
// parallelism adds no tp collective: with ep = 1 or etp = tp the experts
// compute on the gathered tokens with partial outputs that the MoE's
// reduce-scatter sums, and with etp = 1 each tp rank routes its 1/tp of
// the gathered (token, expert) rows (ReordererSequenceParallel) and
// scatters them back into the same partial output.

// Tensor-parallel purposes (see TPCollectives).
const (
	PurposeTPGather   Purpose = "tp_gather"      // all-gather out of the sequence-parallel region (activation dtype)
	PurposeTPReduce   Purpose = "tp_reduce"      // reduce-scatter back into it
	PurposeTPRegather Purpose = "tp_regather"    // a selective-recompute all-gather re-run in backward
	PurposeTPLoss     Purpose = "tp_loss_reduce" // loss parallel's per-token all-reduces (f32)
	PurposeTPGradGath Purpose = "tp_gather_grad" // backward of a reduce-scatter: all-gather of the output gradient
	PurposeTPGradRed  Purpose = "tp_reduce_grad" // backward of an all-gather: reduce-scatter of the input gradient
	PurposeTPGradSync Purpose = "tp_grad_sync"   // all-reduce of the replicated tensors' gradients (TPReplicatedElements)
)

// The tensors tp keeps whole on every member (the norms, the router gate,
// the shared-expert gate: moe.TPReplicated) take gradients that are partial
// sums over the group, each member having computed them from its own
// tokens (the sequence-parallel norms) or its own heads and widths. PyTorch
// sums them where FSDP2 reads a unit's unsharded gradients after its
// backward: FSDPParam.unsharded_grad_data redistributes a DTensor gradient
// to the parameter's tp placements, Partial → Replicate, an all-reduce over
// tp, before foreach_reduce casts to the reduce type and reduce-scatters
// (pytorch/pytorch 17a7e1e09b3e17825b4cb51d75dab1a764712793,
// torch/distributed/fsdp/_fully_shard/_fsdp_param.py _get_grad_inner_tensor;
// FSDPParamGroup.post_backward). It runs on the computation's stream, in
// the unsharded gradient's type: the compute type (FSDP2's param_dtype), or
// the reduce type when gradient sync is skipped and FSDP2 accumulates the
// unsharded gradients in it (FSDPParam.to_accumulated_grad_if_needed).

// TPReplicatedElements is the number of elements of unit u's tensors that
// tensor parallelism keeps whole (moe.TPReplicated, buffers excluded): what
// the all-reduce of their gradients over tp moves as NCCL's S. Zero for a
// routed-expert unit, whose weights are all split or whole experts.
func TPReplicatedElements(x *UnitIndex, u Unit) int64 {
	if u.Experts {
		return 0
	}
	var n int64
	for _, i := range x.ByLayer[u.Layer] {
		if p := x.params[i]; p.TP == moe.TPReplicated {
			e := int64(1)
			for _, d := range p.Shape {
				e *= int64(d)
			}
			n += e
		}
	}
	return n
}

// TPColl is one tensor-parallel collective of a layer in one micro-step,
// placed before or after a compute segment of a phase.
type TPColl struct {
	Phase    Phase   // PhaseForward, PhaseRecompute or PhaseBackward
	Segment  Segment // the compute it is adjacent to
	After    bool    // it runs after that compute (else before it)
	Coll     CollKind
	Purpose  Purpose
	DType    moe.DType
	Elements int64  // NCCL's S: the gathered output, the unsharded input, the all-reduce buffer
	What     string // what it moves, for reports
}

// Bytes is Elements × DType size.
func (c TPColl) Bytes() int64 { return c.Elements * c.DType.Bytes() }

// TPCollectives lists the tensor-parallel collectives of layer
// (moe.LayerEmbed, a block, or cfg.LayerHead()) in one micro-step of tokens
// tokens per data-parallel rank under policy ac, in issue order: forward,
// the recompute's, backward. Empty when tp = 1.
func TPCollectives(cfg *moe.Config, l job.Layout, layer, tokens int, ac moe.AC, act moe.DType) []TPColl {
	if l.TPDegree() == 1 {
		return nil
	}
	S := int64(tokens) * int64(cfg.Hidden)
	c := func(ph Phase, seg Segment, after bool, k CollKind, p Purpose, what string) TPColl {
		return TPColl{Phase: ph, Segment: seg, After: after, Coll: k, Purpose: p, DType: act, Elements: S, What: what}
	}
	switch {
	case layer == moe.LayerEmbed:
		return []TPColl{
			c(PhaseForward, SegEmbed, true, CollReduceScatter, PurposeTPReduce, "embedding partial output"),
			c(PhaseBackward, SegEmbed, false, CollAllGather, PurposeTPGradGath, "embedding output gradient"),
		}
	case layer == cfg.LayerHead():
		loss := func(what string) TPColl {
			return TPColl{Phase: PhaseForward, Segment: SegHead, After: true, Coll: CollAllReduce, Purpose: PurposeTPLoss,
				DType: moe.F32, Elements: int64(tokens), What: what}
		}
		return []TPColl{
			c(PhaseForward, SegHead, false, CollAllGather, PurposeTPGather, "final_norm output → lm_head"),
			loss("loss parallel: max logit"), loss("loss parallel: sum of exponentials"), loss("loss parallel: target logit"),
			c(PhaseBackward, SegHead, true, CollReduceScatter, PurposeTPGradRed, "lm_head input gradient"),
		}
	case layer < 0 || layer >= cfg.Layers:
		return nil
	}
	// Segments of the block: a dense block is one segment; a MoE block's
	// attention half and router are SegPre and its residual SegPost.
	first, last := SegBlock, SegBlock
	if cfg.MoELayer[layer] {
		first, last = SegPre, SegPost
	}
	ffn := "ffn_norm output → w1/w3"
	if cfg.MoELayer[layer] {
		ffn = "ffn_norm output → MoE (router, experts)"
	}
	forward := func(ph Phase) []TPColl {
		return []TPColl{
			c(ph, first, false, CollAllGather, PurposeTPGather, "attention_norm output → q/k/v"),
			c(ph, first, true, CollReduceScatter, PurposeTPReduce, "o_proj partial sums"),
			c(ph, first, true, CollAllGather, PurposeTPGather, ffn),
			c(ph, last, true, CollReduceScatter, PurposeTPReduce, "w2 / MoE output partial sums"),
		}
	}
	out := forward(PhaseForward)
	switch {
	case ac.FullyCheckpointed(layer):
		out = append(out, forward(PhaseRecompute)...)
	case ac.Caches(): // selective, memory budget: the block's forward re-runs from its cache
		out = append(out,
			c(PhaseBackward, last, false, CollAllGather, PurposeTPRegather, "recompute: attention_norm output → q/k/v"),
			c(PhaseBackward, last, false, CollAllGather, PurposeTPRegather, "recompute: "+ffn))
	}
	out = append(out, c(PhaseBackward, last, false, CollAllGather, PurposeTPGradGath, "w2 / MoE output gradient"))
	if ac.NormRecomputed(cfg, layer, moe.OpFFNNorm) {
		// The modules policy's layernorm re-runs the sequence-parallel
		// norm and its all-gather once the output gradient is gathered.
		out = append(out, c(PhaseBackward, last, false, CollAllGather, PurposeTPRegather, "recompute: "+ffn))
	}
	return append(out,
		c(PhaseBackward, first, true, CollReduceScatter, PurposeTPGradRed, "FFN / MoE input gradient"),
		c(PhaseBackward, first, true, CollAllGather, PurposeTPGradGath, "o_proj output gradient"),
		c(PhaseBackward, first, true, CollReduceScatter, PurposeTPGradRed, "q/k/v input gradient"),
	)
}
