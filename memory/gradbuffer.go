package memory

import "github.com/moescope/moescope/moe"

// contiguousGrads rewrites a step's events (what torch's data-parallel
// wrappers do with gradients) into what Megatron-Core's
// DistributedDataParallel does, read at Megatron-LM
// 0d8e0714cd29c01e164fe6de9f532182bdffa942:
//
//   - the gradients live in one contiguous buffer per parameter and
//     gradient type, allocated with torch.zeros when the model is wrapped
//     and kept across steps (megatron/core/distributed/param_and_grad_buffer.py,
//     _ParamAndGradBuffer.__init__: grad_data; zero_grad_buffer zeroes it in
//     place): grads bytes (State.Grads, the whole local gradient in the
//     gradient type: grad_reduce_in_fp32 makes it fp32) are allocated in
//     setup, before the optimizer state, and never freed;
//   - the weight-gradient GEMMs accumulate into it (param.main_grad, with
//     gradient_accumulation_fusion, which Megatron-LM's arguments and
//     Megatron-Bridge's model providers turn on where the fused kernel is
//     available): no gradient is allocated in backward, and none is kept
//     apart across micro-steps;
//   - the distributed optimizer reduce-scatters each bucket in place, into
//     the rank's shard of the same buffer (reduce_scatter_tensor with
//     local_data_view, param_and_grad_buffer.py): no reduce-scatter input
//     or output is allocated.
//
// So every gradient and reduce-scatter event is dropped, and the buffer
// allocated once, after the setup's parameters (Megatron wraps the model
// before it builds the optimizer).
func contiguousGrads(events []Event, grads int64) []Event {
	k := 0
	for k < len(events) && events[k].Phase == Setup && events[k].Category == CatParams {
		k++
	}
	out := make([]Event, 0, len(events)+1)
	out = append(out, events[:k]...)
	out = append(out, Event{Phase: Setup, Micro: -1, Layer: moe.LayerEmbed, Label: "grad_buffer", Alloc: true,
		Bytes: grads, Category: CatGrads, Stream: ComputeStream})
	for _, e := range events[k:] {
		if !dropsForBuffer(e) {
			out = append(out, e)
		}
	}
	return out
}

// dropsForBuffer says whether e is a gradient event that Megatron's
// buffer replaces: a gradient (reduced or not, accumulated or not) or a
// reduce-scatter buffer.
func dropsForBuffer(e Event) bool {
	return e.Category == CatGrads || e.Category == CatUnshardGrad || (e.Category == CatComm && e.Label == "reduce_scatter")
}
