package job

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/moescope/moescope/moe"
)

// OptimizerImpl is the AdamW implementation.
type OptimizerImpl string

// AdamW implementations: fused (torchtitan's default since 2025: no
// temporaries) and foreach (torch's _multi_tensor_adamw, torchtitan's
// default before: sqrt(v) is materialized for every local element during
// the step).
const (
	FusedAdamW   OptimizerImpl = "fused"
	ForeachAdamW OptimizerImpl = "foreach"
)

// AttentionKernel names the attention implementation.
type AttentionKernel string

// Attention kernels.
const (
	// CuDNNAttention is cuDNN's fused attention, first in torchtitan's SDPA
	// priority (torchtitan/models/attention.py at 0012170a,
	// ScaledDotProductAttentionWrapper: CUDNN_ATTENTION, FLASH_ATTENTION,
	// EFFICIENT_ATTENTION, MATH with set_priority=True): the default.
	CuDNNAttention AttentionKernel = "cudnn"
	// Flash2Attention is FlashAttention-2, PyTorch's own first SDPA choice
	// (its default priority order puts flash first), which torchtitan ran
	// before it set the priority.
	Flash2Attention AttentionKernel = "flash2"
	// EagerAttention is attention in plain ops (SDPA's math backend): it
	// saves the probabilities for backward. The memory model sizes it;
	// the time model does not price it.
	EagerAttention AttentionKernel = "eager"
)

// Dispatcher names how expert parallelism moves tokens.
type Dispatcher string

// Dispatchers.
const (
	// AllToAll is torchtitan's: an all-to-all of every routed row, one per
	// top-k slot.
	AllToAll Dispatcher = "all_to_all"
	// DeepEP and HybridEP send one row per token and destination rank
	// (DeepEP's kernels; HybridEP is its NVLink-domain variant, priced the
	// same).
	DeepEP   Dispatcher = "deepep"
	HybridEP Dispatcher = "hybridep"
)

// RowPerRank says the dispatcher sends a token once to each destination
// rank rather than once per top-k slot.
func (d Dispatcher) RowPerRank() bool { return d == DeepEP || d == HybridEP }

// ExpertGEMM names the routed experts' matmul kernel.
type ExpertGEMM string

// Expert matmul kernels.
const (
	// GroupedMM is torch._grouped_mm, one grouped kernel per projection
	// (torchtitan's GroupedExperts).
	GroupedMM ExpertGEMM = "grouped_mm"
	// CuBLASExperts is one cuBLAS GEMM per local expert on a pool of CUDA
	// streams: TransformerEngine's GroupedLinear (Megatron-Core's
	// TEGroupedMLP, NeMo AutoModel's experts: te), whose
	// nvte_multi_tensor_gemm takes multi_stream_cublas_gemm unless
	// NVTE_USE_CUTLASS_GROUPED_GEMM is set (NVIDIA/TransformerEngine
	// transformer_engine/common/gemm/cublaslt_gemm.cu).
	CuBLASExperts ExpertGEMM = "cublas"
)

// TransformerImpl names the modules a block is built of, which decide what
// it saves for backward (memory/te.go, memory/automodel.go).
type TransformerImpl string

// Transformer implementations.
const (
	// TorchTransformer is torchtitan's PyTorch modules, what the reference
	// implementation executes (eager or compiled): the default.
	TorchTransformer TransformerImpl = "torch"
	// TETransformer is Megatron-Core's TransformerEngine layer spec
	// (Megatron-LM's --transformer-impl transformer_engine) with its
	// default fused SwiGLU (bias_activation_fusion) and its experts, which
	// apply the routing probabilities in the activation.
	TETransformer TransformerImpl = "transformer_engine"
	// AutoModelTransformer is NeMo AutoModel's own MoE model classes and
	// trainer (nemo_automodel/components/moe and models/, recipes/llm/
	// train_ft.py, at Automodel 2c236e081, the recipes of its performance
	// summary): DeepEP experts that apply the routing probabilities in a
	// fused activation, FakeBalancedGate for balanced routing, GPT-OSS's
	// sink rescaling outside flex attention, and logits held through
	// backward (memory/automodel.go).
	AutoModelTransformer TransformerImpl = "automodel"
)

// LossImpl names the cross-entropy implementation.
type LossImpl string

// Cross-entropy implementations.
const (
	// TorchLoss is torchtitan's cross-entropy, eager or compiled
	// (compile_components): the default.
	TorchLoss LossImpl = "torch"
	// TELoss is TransformerEngine's parallel_cross_entropy (Megatron's
	// cross_entropy_loss_fusion with cross_entropy_fusion_impl "te"):
	// its forward writes the gradient into the logits, which it saves.
	TELoss LossImpl = "te"
)

// DDPImpl names the data-parallel wrapper that holds the gradients under
// sharding zero1 or ddp.
type DDPImpl string

// Data-parallel wrappers.
const (
	// TorchDDP is PyTorch's: each parameter's gradient is allocated by
	// autograd in backward, then reduced (the default).
	TorchDDP DDPImpl = "torch"
	// MegatronDDP is Megatron-Core's DistributedDataParallel: one
	// contiguous gradient buffer in the gradient type, allocated when the
	// model is wrapped, into which the weight-gradient GEMMs accumulate
	// (gradient_accumulation_fusion) and which is reduce-scattered in place
	// (memory/gradbuffer.go).
	MegatronDDP DDPImpl = "megatron"
)

// Values lists each enum's allowed values: Recipe.Validate checks against
// it, and the command line's help prints it.
func (OptimizerImpl) Values() []string { return names([]OptimizerImpl{FusedAdamW, ForeachAdamW}) }
func (AttentionKernel) Values() []string {
	return names([]AttentionKernel{CuDNNAttention, Flash2Attention, EagerAttention})
}
func (Dispatcher) Values() []string { return names([]Dispatcher{AllToAll, DeepEP, HybridEP}) }
func (ExpertGEMM) Values() []string { return names([]ExpertGEMM{GroupedMM, CuBLASExperts}) }
func (Component) Values() []string  { return names([]Component{ModelComponent, LossComponent}) }
func (TransformerImpl) Values() []string {
	return names([]TransformerImpl{TorchTransformer, TETransformer, AutoModelTransformer})
}
func (LossImpl) Values() []string { return names([]LossImpl{TorchLoss, TELoss}) }
func (DDPImpl) Values() []string  { return names([]DDPImpl{TorchDDP, MegatronDDP}) }

func names[T ~string](vs []T) []string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = string(v)
	}
	return s
}

// joinValues lists an enum's values for a message: "a, b, c".
func joinValues[T ~string](vs []T) string { return strings.Join(names(vs), ", ") }

// TorchVersion is the PyTorch release a run uses, as MAJOR.MINOR; the
// zero value is a release recent enough for every kernel the time model
// knows (2.9 or later). JSON: the string "MAJOR.MINOR".
type TorchVersion struct{ Major, Minor int }

// ParseTorchVersion reads "MAJOR.MINOR" with an optional tail of a patch
// level or local build ("2.6", "2.9.0", "2.10.0.dev20250916+cu130"); ""
// is the zero value. field names the flag or key in errors.
func ParseTorchVersion(field, s string) (TorchVersion, error) {
	if s == "" {
		return TorchVersion{}, nil
	}
	parts := strings.SplitN(s, ".", 3)
	bad := moe.FieldError{Field: field, Value: s, Allowed: "must be a PyTorch release MAJOR.MINOR (e.g. 2.6 or 2.9.0), major in [1, 9], minor in [0, 99]"}
	if len(parts) < 2 {
		return TorchVersion{}, bad
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || major < 1 || major > 9 || minor < 0 || minor > 99 {
		return TorchVersion{}, bad
	}
	return TorchVersion{major, minor}, nil
}

// Before reports whether v is a stated release older than w (the zero
// value is never older).
func (v TorchVersion) Before(w TorchVersion) bool {
	if v == (TorchVersion{}) {
		return false
	}
	return v.Major < w.Major || v.Major == w.Major && v.Minor < w.Minor
}

func (v TorchVersion) String() string {
	if v == (TorchVersion{}) {
		return ""
	}
	return fmt.Sprintf("%d.%d", v.Major, v.Minor)
}

// MarshalText writes "MAJOR.MINOR".
func (v TorchVersion) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText reads what ParseTorchVersion reads.
func (v *TorchVersion) UnmarshalText(b []byte) error {
	t, err := ParseTorchVersion("torch_version", string(b))
	*v = t
	return err
}
