// Package epbuffer sizes the communication buffers an expert-parallel
// dispatcher allocates outside PyTorch's caching allocator, which
// torch.cuda.max_memory_reserved does not count but an out-of-memory error
// does.
//
// DeepEP's normal (training) kernels, from deepseek-ai/DeepEP at 92fe2de
// (the last release of its legacy Buffer, 2025-11-05): the framework sizes
// one Buffer per expert-parallel group as DeepEP's README's get_buffer does
// (and Megatron-Core's fused_a2a.py, get_buffer): for the recommended
// dispatch and combine configs of the group size
// (deep_ep/buffer.py, get_dispatch_config and get_combine_config), the
// larger of each one's NVLink and RDMA size hints (csrc/config.hpp,
// Config.get_nvl_buffer_size_hint and get_rdma_buffer_size_hint), with
// hidden_bytes = hidden × max(element size, 2) of the bf16 tokens. The
// NVLink buffer is cudaMalloc'd and shared by IPC (csrc/deep_ep.cpp,
// Buffer::Buffer), the RDMA buffer comes from NVSHMEM's symmetric heap, and
// every Buffer also allocates a 32 MiB workspace (NUM_WORKSPACE_BYTES,
// csrc/kernels/configs.cuh).
package epbuffer

import "fmt"

// deepEPConfig is DeepEP's Config: the SMs its kernels take and the chunk
// sizes, in tokens, of the NVLink and RDMA queues.
type deepEPConfig struct {
	sms                    int
	nvlSend, nvlRecv       int
	rdmaSend, rdmaRecvWant int // rdmaRecvWant before Config's align_up to rdmaSend
}

// DeepEPSMs is Buffer.num_sms, the SMs DeepEP's normal kernels take by
// default (deep_ep/buffer.py at 92fe2de: num_sms: int = 20; Megatron-Core's
// --moe-deepep-num-sms defaults to it too).
const DeepEPSMs = 20

// DeepEP's compile-time constants (92fe2de): NUM_MAX_NVL_PEERS (deep_ep.hpp),
// kNumMaxTopK and kNumMaxScales (config.hpp), sizeof(SourceMeta)
// (kernels/internode.cu: two ints), sizeof(topk_idx_t) (kernels/configs.cuh:
// TOPK_IDX_BITS 64 by default), NUM_WORKSPACE_BYTES.
const (
	maxNVLPeers    = 8
	maxTopK        = 128
	maxScales      = 128
	sourceMetaSize = 8
	topkIdxSize    = 8
	workspaceBytes = 32 << 20
)

// dispatchConfigs and combineConfigs are get_dispatch_config and
// get_combine_config's tables (deep_ep/buffer.py at 92fe2de), by group size.
var dispatchConfigs = map[int]deepEPConfig{
	2: {DeepEPSMs, 24, 256, 6, 128}, 4: {DeepEPSMs, 6, 256, 6, 128}, 8: {DeepEPSMs, 6, 256, 6, 128},
	16: {DeepEPSMs, 36, 288, 20, 128}, 24: {DeepEPSMs, 32, 288, 8, 128}, 32: {DeepEPSMs, 32, 288, 8, 128},
	48: {DeepEPSMs, 32, 288, 8, 128}, 64: {DeepEPSMs, 32, 288, 8, 128}, 96: {DeepEPSMs, 20, 480, 12, 128},
	128: {DeepEPSMs, 20, 560, 12, 128}, 144: {DeepEPSMs, 32, 720, 12, 128}, 160: {DeepEPSMs, 28, 720, 12, 128},
}

var combineConfigs = map[int]deepEPConfig{
	2: {DeepEPSMs, 10, 256, 6, 128}, 4: {DeepEPSMs, 9, 256, 6, 128}, 8: {DeepEPSMs, 4, 256, 6, 128},
	16: {DeepEPSMs, 4, 288, 12, 128}, 24: {DeepEPSMs, 1, 288, 8, 128}, 32: {DeepEPSMs, 1, 288, 8, 128},
	48: {DeepEPSMs, 1, 288, 8, 128}, 64: {DeepEPSMs, 1, 288, 8, 128}, 96: {DeepEPSMs, 1, 480, 8, 128},
	128: {DeepEPSMs, 1, 560, 8, 128}, 144: {DeepEPSMs, 2, 720, 8, 128}, 160: {DeepEPSMs, 2, 720, 8, 128},
}

// DeepEPBytes is the device memory one rank's DeepEP Buffer allocates for
// an expert-parallel group of ranks ranks moving tokens of hidden bf16
// elements: the NVLink buffer, the RDMA buffer (none within one NVLink
// group of 8) and the workspace. A group size DeepEP has no recommended
// config for is an error naming the sizes it has.
func DeepEPBytes(hidden, ranks int) (int64, error) {
	d, okD := dispatchConfigs[ranks]
	c, okC := combineConfigs[ranks]
	if !okD || !okC {
		return 0, fmt.Errorf("dispatcher deepep with ep = %d: DeepEP (92fe2de, buffer.py get_dispatch_config) recommends configs for groups of 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144 or 160 ranks only", ranks)
	}
	hiddenBytes := int64(hidden) * 2
	nvl := max(d.nvlBytes(hiddenBytes, ranks), c.nvlBytes(hiddenBytes, ranks))
	rdma := max(d.rdmaBytes(hiddenBytes, ranks), c.rdmaBytes(hiddenBytes, ranks))
	return nvl + rdma + workspaceBytes, nil
}

// nvlBytes is Config::get_nvl_buffer_size_hint (NVSHMEM enabled, as a
// build for internode training is): per channel (two SMs) and NVLink peer,
// the queue heads and tails, then per received token of the queue its
// hidden bytes, source metadata, top-k indices and weights and scales,
// aligned up to 128 bytes.
func (c deepEPConfig) nvlBytes(hiddenBytes int64, ranks int) int64 {
	rdmaRanks, nvlRanks := int64(max(ranks/maxNVLPeers, 1)), int64(min(ranks, maxNVLPeers))
	ch := int64(c.sms / 2)
	q := ch * nvlRanks * int64(c.nvlRecv)
	n := ch*nvlRanks*(2*rdmaRanks+3)*4 + q*(hiddenBytes+sourceMetaSize+maxTopK*topkIdxSize+maxTopK*4+maxScales*4)
	return alignUp(n, 128)
}

// rdmaBytes is Config::get_rdma_buffer_size_hint: zero within one NVLink
// group; else per channel and RDMA peer, twice (send and receive) the
// heads and tails and, per token of the receive queue (aligned up to the
// send chunk by Config's constructor), the hidden bytes, metadata, top-k
// indices, weights, scales and an int4, aligned up to 128 bytes.
func (c deepEPConfig) rdmaBytes(hiddenBytes int64, ranks int) int64 {
	if ranks <= maxNVLPeers {
		return 0
	}
	rdmaRanks := int64(ranks / maxNVLPeers)
	ch := int64(c.sms / 2)
	recv := alignUp(int64(c.rdmaRecvWant), int64(c.rdmaSend))
	q := ch * rdmaRanks * recv
	n := ch*rdmaRanks*(maxNVLPeers*2+2)*2*4 + 2*q*(hiddenBytes+sourceMetaSize+maxTopK*topkIdxSize+maxTopK*4+maxScales*4+16)
	return alignUp(n, 128)
}

func alignUp(a, b int64) int64 { return (a + b - 1) / b * b }
