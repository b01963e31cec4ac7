package job

// CUDAGraphs is what the run captures in CUDA graphs and replays, which
// launches the captured kernels from the device instead of one host launch
// each.
type CUDAGraphs string

// CUDA graph scopes.
const (
	// NoGraphs launches every kernel from the host: PyTorch eager and
	// torch.compile's default mode, torchtitan v0.2.2 (73a0e69, which has
	// CUDA graphs only in experiments/compiler_toolkit) and main with
	// --training.disable_cuda_graphs.
	NoGraphs CUDAGraphs = "none"
	// LayerGraphs captures each transformer block's forward and backward:
	// Megatron-LM's --cuda-graph-impl transformer_engine with
	// --cuda-graph-scope attn,mlp,moe (d98e8a64,
	// megatron/core/transformer/cuda_graphs.py, TECudaGraphHelper, which
	// graphs each layer with TransformerEngine's make_graphed_callables).
	LayerGraphs CUDAGraphs = "layers"
	// FullGraphs captures a micro-step's whole forward and backward, the
	// optimizer step outside: torchtitan main's default (b5bcd76,
	// torchtitan/trainer.py, wrap_with_cuda_graph around
	// _forward_backward_body unless training.disable_cuda_graphs) and
	// Megatron-LM's --cuda-graph-impl local with --cuda-graph-scope
	// full_iteration.
	FullGraphs CUDAGraphs = "full"
)

// Values lists the scopes.
func (CUDAGraphs) Values() []string { return names([]CUDAGraphs{NoGraphs, LayerGraphs, FullGraphs}) }

// Captures says whether the graphs hold the ops of a transformer block
// (block) or the ops outside the blocks (embedding, final norm, head, loss).
func (g CUDAGraphs) Captures(block bool) bool {
	return g == FullGraphs || (g == LayerGraphs && block)
}
