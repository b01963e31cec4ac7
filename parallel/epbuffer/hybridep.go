package epbuffer

import "fmt"

// HybridEP's buffers, from deepseek-ai/DeepEP's hybrid-ep branch at
// 94a9f8f (2026-07-10), as torchtitan main b5bcd76
// (torchtitan/distributed/deepep/hybridep.py) and Megatron-LM d98e8a64
// (megatron/core/transformer/moe/fused_a2a.py, init_hybrid_ep_buffer)
// build one HybridEPBuffer per expert-parallel group, with
// use_shared_buffer true (torchtitan passes it, and it is
// deep_ep/hybrid_ep_buffer.py's default), the bf16 tokens of one rank's
// micro-batch as max_num_of_tokens_per_rank and its local experts. Its
// NVLink coordinator (csrc/hybrid_ep/buffer/intranode.cu) allocates,
// through its own ExtendedMemoryAllocator outside PyTorch, for
// maxT = max_num_of_tokens_per_rank × ranks per NVLink domain × domains
// ("all tokens are routed to the same expert"), the tokens per rank first
// padded to the combine chunk, 64 by default (csrc/hybrid_ep/config.cuh,
// hybrid_ep_pad_num_of_tokens_per_rank and
// NUM_OF_TOKENS_PER_CHUNK_COMBINE_API):
//
//   - the combine's expert_input_token, maxT × hidden uint16, and
//     expert_input_prob, maxT × (local experts × ranks per domain) float32
//     (allocate_combine_buffers), which dispatch shares (use_shared_buffer);
//   - dispatch's expert_output_scaling_factor, maxT × hidden/128 float32,
//     allocated even without fp8 (allocate_dispatch_buffers).
//
// Left out, named: the chunk-completion flags and the preprocessing
// scratch (per block and rank, kilobytes), and, when the group spans
// NVLink domains, the internode RDMA buffers (internode_doca.cu,
// internode_nixl.cu), not read here: such a group's figure is a lower
// bound.

// hybridEPChunk is NUM_OF_TOKENS_PER_CHUNK_COMBINE_API's default.
const hybridEPChunk = 64

// HybridEPBytes is the device memory the NVLink buffers of one rank's
// HybridEPBuffer take: an expert-parallel group of ep ranks in NVLink
// domains of domain GPUs, each rank sending tokens (a micro-batch's) of
// hidden bf16 elements to localExperts experts per rank.
func HybridEPBytes(hidden, tokens, localExperts, ep, domain int) (int64, error) {
	if hidden < 1 || tokens < 1 || localExperts < 1 || ep < 1 || domain < 1 {
		return 0, fmt.Errorf("dispatcher hybridep: hidden %d, tokens %d, local experts %d, ep %d, NVLink domain %d: each must be ≥ 1", hidden, tokens, localExperts, ep, domain)
	}
	perDomain := int64(min(ep, domain))
	maxT := alignUp(int64(tokens), hybridEPChunk) * int64(ep)
	token := maxT * int64(hidden) * 2
	prob := maxT * int64(localExperts) * perDomain * 4
	scale := maxT * int64(hidden/128) * 4
	return token + prob + scale, nil
}
