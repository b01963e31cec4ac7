package memory

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// graphStaticBytes is the memory the run's CUDA graphs keep for their
// static buffers, in PyTorch's allocator for the whole run:
//
//   - full (torchtitan main b5bcd76, torchtitan/distributed/cudagraph.py,
//     CUDAGraphWrapper): the captured step's tensor arguments that are not
//     static are copied into the captured ones before each replay, i.e.
//     the micro-batch's int64 input ids and labels, 16 bytes per token;
//   - layers (Megatron-LM d98e8a64, cuda_graphs.py TECudaGraphHelper,
//     which passes _reuse_graph_input_output_buffers to TransformerEngine
//     ≥ 2.7's make_graphed_callables, d0067d0
//     transformer_engine/pytorch/graph.py): the graphs share their data
//     buffers, a block's static output being the next one's static input
//     (an activation the memory model already holds), and one static bf16
//     gradient of the output per shape (static_grad_outputs_dict), so what
//     the graphs add is the first block's static input and that one
//     gradient buffer, each tokens × hidden in bf16.
//
// over the rank's tokens of one micro-batch (a tensor-parallel rank's share
// under sequence parallelism; a context-parallel rank's shard, as the
// activations are counted). The pools' intermediates are the step's own
// activations, already in the timeline. setup allocates the buffers first,
// as category cuda_graphs, held for the whole step.
func graphStaticBytes(cfg *moe.Config, g job.CUDAGraphs, sh Shape) int64 {
	tokens := int64(sh.Batch) * int64(sh.Seq)
	switch g {
	case job.FullGraphs:
		return 16 * tokens
	case job.LayerGraphs:
		return 2 * (tokens / int64(max(sh.TP, 1))) * int64(cfg.Hidden) * 2
	}
	return 0
}
