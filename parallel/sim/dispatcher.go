package sim

import (
	"fmt"

	"github.com/moescope/moescope/moe"
)

// Dispatcher is how expert parallelism moves tokens to the ranks that hold
// their experts.
type Dispatcher string

const (
	// AllToAllDispatch is torchtitan's: one all_to_all_single of every
	// (token, top-k slot) row, the rows a rank keeps included.
	AllToAllDispatch Dispatcher = ""
	// DeepEPDispatch is DeepEP's normal kernels (deepseek-ai/DeepEP,
	// deep_ep/buffer.py: get_dispatch_layout returns is_token_in_rank and
	// num_tokens_per_rank, and dispatch sends each token once to every EP
	// rank that holds at least one of its experts; combine returns one row
	// per (token, rank), reduced on the sender's side of the receiver), as
	// Megatron-Core's flex dispatcher and NeMo AutoModel's deepep and
	// hybridep dispatchers run them.
	DeepEPDispatch Dispatcher = "deepep"
)

// ParseDispatcher reads a run's or flag's dispatcher: "" or "all_to_all"
// (torchtitan's), "deepep" (also "hybridep", DeepEP's hybrid kernels with
// the same per-rank deduplication).
func ParseDispatcher(field, s string) (Dispatcher, error) {
	switch s {
	case "", "all_to_all":
		return AllToAllDispatch, nil
	case "deepep", "hybridep":
		return DeepEPDispatch, nil
	}
	return "", fmt.Errorf("%s = %q: must be all_to_all (torchtitan's), deepep or hybridep", field, s)
}

// dispatchShare is the fraction of the (token, slot) rows the dispatcher
// sends: 1 for an all-to-all of every row; for DeepEP the expected number
// of distinct EP ranks among a token's top-k experts over k, with k of E
// experts drawn without repetition, uniformly (balanced routing), from ep
// ranks of E/ep each: ep·(1 − C(E − E/ep, k)/C(E, k))/k.
func dispatchShare(d Dispatcher, cfg *moe.Config, ep int) float64 {
	E, k := cfg.Experts, cfg.TopK
	if d != DeepEPDispatch || ep <= 1 || k <= 1 || E%ep != 0 {
		return 1
	}
	// C(E − E/ep, k)/C(E, k) = Π_{i<k} (E − E/ep − i)/(E − i).
	miss := 1.0
	for i := range k {
		miss *= float64(E-E/ep-i) / float64(E-i)
		if miss <= 0 {
			miss = 0
			break
		}
	}
	return float64(ep) * (1 - miss) / float64(k)
}

// ExpertGEMM is the kernel that runs the routed experts' matmuls.
type ExpertGEMM string

const (
	// GroupedMMExperts is torch._grouped_mm, one grouped kernel per
	// projection (torchtitan's GroupedExperts).
	GroupedMMExperts ExpertGEMM = ""
	// CuBLASExperts is one cuBLAS GEMM per local expert on a pool of CUDA
	// streams: TransformerEngine's GroupedLinear (Megatron-Core's
	// TEGroupedMLP, NeMo AutoModel's experts: te), whose
	// nvte_multi_tensor_gemm takes multi_stream_cublas_gemm unless
	// NVTE_USE_CUTLASS_GROUPED_GEMM is set (NVIDIA/TransformerEngine
	// transformer_engine/common/gemm/cublaslt_gemm.cu).
	CuBLASExperts ExpertGEMM = "cublas"
)

// ParseExpertGEMM reads a run's expert_gemm: "" or "grouped_mm", or
// "cublas".
func ParseExpertGEMM(field, s string) (ExpertGEMM, error) {
	switch s {
	case "", "grouped_mm":
		return GroupedMMExperts, nil
	case "cublas":
		return CuBLASExperts, nil
	}
	return "", fmt.Errorf("%s = %q: must be grouped_mm (torch._grouped_mm, torchtitan's) or cublas (TransformerEngine's per-expert GEMMs)", field, s)
}
