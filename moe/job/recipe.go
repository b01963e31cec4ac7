package job

import (
	"errors"
	"math"
	"slices"
	"strings"

	"github.com/moescope/moescope/moe"
)

// Recipe is what a run executes with besides its model, layout, batch and
// checkpointing: the precision recipe and storage types, torch.compile, the
// allocator, the kernels and the expert-parallel dispatcher. JSON keys are
// DESIGN's flag names with underscores; a key left out keeps its default
// (DefaultRecipe), and Resolve fills what depends on another field. The
// command line is derived from this struct: one flag per field, named for
// its JSON key with dashes (or its flag tag), with its help tag ({values}
// there lists the type's Values); an empty value is refused unless the
// field's empty tag allows it.
type Recipe struct {
	// Precision is the training recipe (DESIGN's --precision).
	Precision Precision `json:"precision" help:"training recipe: {values} (a recipe not priced yet is refused, naming those that are)"`
	// Quantize is the GEMMs the recipe converts (empty: DefaultQuantize).
	Quantize Quantize `json:"quantize,omitempty" help:"GEMMs the low-precision recipe converts, comma-separated: linear (attention projections, dense and shared FFNs), experts (routed grouped GEMMs), output (the head); attention is not priced yet; the router stays bf16 (default: fp8-tensorwise linear; the other recipes linear,experts)"`
	// FP8AllGather: FSDP2 all-gathers the converted linears' weights in
	// fp8 (torchao's float8 all-gather, torchtitan's
	// quantize.linear.float8.enable_fsdp_float8_all_gather), tensorwise only.
	FP8AllGather bool `json:"fp8_all_gather,omitempty" help:"FSDP2 all-gathers the converted linears' weights in fp8 (torchtitan's enable_fsdp_float8_all_gather; fp8-tensorwise only)"`
	// FP8RowwiseGWHP is torchao's "rowwise_with_gw_hp" recipe: the
	// converted linears' weight-gradient GEMMs stay in bf16 (input_t_hp @
	// grad_output_hp), the data gradient casts the weight tensorwise
	// (pytorch/ao 36027d82 torchao/float8/config.py, ROWWISE_WITH_GW_HP);
	// the routed experts' grouped GEMMs are torchao's fp8 rowwise grouped
	// GEMM, whose weight gradient is fp8 either way
	// (torchao/prototype/moe_training/fp8_grouped_mm.py). fp8-rowwise only.
	FP8RowwiseGWHP bool `json:"fp8_rowwise_gw_hp,omitempty" help:"torchao's rowwise_with_gw_hp: the converted linears' weight gradients stay bf16 (fp8-rowwise only)"`
	// Storage types (DESIGN's "Precision and compile"): sharded
	// parameters, gradients, the type gradients are reduced in (FSDP2's
	// reduce_dtype; Resolve sets it to GradDType when left empty), AdamW
	// moments, and the type the eager cross-entropy computes in.
	ParamDType     moe.DType `json:"param_dtype" help:"sharded parameter storage type: f32|bf16"`
	GradDType      moe.DType `json:"grad_dtype" help:"gradient storage type: f32|bf16"`
	ReduceDType    moe.DType `json:"reduce_dtype" empty:"ok" help:"type gradients are reduced in (FSDP2 reduce_dtype) and, with --grad-sync-last-only, accumulated in: f32|bf16 (default: the --grad-dtype)"`
	OptimizerDType moe.DType `json:"optimizer_dtype" help:"AdamW moment storage type: f32|bf16"`
	// MasterDType is the type of a master copy of the parameters that
	// the optimizer keeps beside its moments and shards as it shards
	// them (empty: none, the stored parameters are the master copy, as
	// in torchtitan). Megatron-Core's distributed optimizer keeps bf16
	// model parameters (ParamDType bf16) and fp32 main parameters
	// sharded with the Adam moments over the data-parallel ranks
	// (master_dtype f32): docs/memory.md, "Master copy".
	MasterDType moe.DType `json:"master_dtype,omitempty" empty:"ok" help:"type of a master copy of the parameters kept and sharded with the optimizer state (Megatron's distributed optimizer: f32 main parameters beside bf16 model parameters): f32|bf16 (default: none)"`
	LossDType   moe.DType `json:"loss_dtype" help:"type the eager cross-entropy computes in: f32 (torchtitan's pred.float()) or bf16 (no upcast)"`
	// Compile is torch.compile on (torchtitan's compile.enable);
	// CompileComponents what it compiles (torchtitan's compile.components,
	// empty = model and loss).
	Compile           bool       `json:"compile" help:"torch.compile the blocks and the loss as torchtitan's --compile.enable does (fused intermediates are not saved; --compile=false is eager)"`
	CompileComponents Components `json:"compile_components,omitempty" help:"what torch.compile compiles, comma-separated (torchtitan's compile.components; default: model,loss)"`
	// ExpandableSegments is PYTORCH_ALLOC_CONF=expandable_segments:True,
	// which torchtitan's run_train.sh sets.
	ExpandableSegments bool `json:"expandable_segments" help:"the caching allocator grows segments in place (PYTORCH_ALLOC_CONF=expandable_segments:True, as torchtitan's run_train.sh sets; false = fixed segments)"`
	// LossChunks > 1 computes logits, loss and their gradients chunk by
	// chunk over tokens (0 or 1 = one piece).
	LossChunks int `json:"loss_chunks,omitempty" help:"chunked cross-entropy over this many token chunks (0 or 1 = one piece)"`
	// Optimizer is the AdamW implementation.
	Optimizer OptimizerImpl `json:"optimizer" flag:"optimizer-impl" help:"AdamW implementation: fused (no temporaries) or foreach (sqrt(v) materialized)"`
	// Attention is the attention kernel.
	Attention AttentionKernel `json:"attention_kernel" help:"attention kernel: cudnn (torchtitan's SDPA priority), flash2 (FlashAttention-2) or eager (plain ops, saves the probabilities; memory only)"`
	// TransformerImpl is the modules the blocks are built of and LossImpl
	// the cross-entropy's: what they save for backward (docs/memory.md,
	// "TransformerEngine" and "AutoModel"). Empty is torch (TorchTransformer, TorchLoss),
	// left out of JSON.
	TransformerImpl TransformerImpl `json:"transformer_impl,omitempty" empty:"ok" help:"modules the blocks are built of, which decide what they save for backward: torch (torchtitan's), transformer_engine (Megatron-Core's TE layer spec: fused SwiGLU, routing probabilities applied in the expert activation, fp8 inputs saved quantized) or automodel (NeMo AutoModel's MoE models and trainer: DeepEP experts with a fused weighted activation, no router under balanced routing, logits held through backward; bf16, eager)"`
	LossImpl        LossImpl        `json:"loss_impl,omitempty" empty:"ok" help:"cross-entropy implementation: torch (torchtitan's, eager or compiled) or te (TransformerEngine's parallel_cross_entropy, which writes the gradient into the saved bf16 logits)"`
	// DDPImpl is the data-parallel wrapper that holds the gradients under
	// sharding zero1 or ddp (empty: torch, left out of JSON).
	DDPImpl DDPImpl `json:"ddp_impl,omitempty" empty:"ok" help:"data-parallel wrapper holding the gradients under sharding zero1 or ddp: torch (autograd allocates each gradient in backward) or megatron (Megatron-Core's one contiguous gradient buffer, allocated at start, accumulated into by the weight-gradient GEMMs and reduce-scattered in place)"`
	// Dispatcher moves the expert-parallel tokens; ExpertGEMM runs the
	// routed experts' matmuls.
	Dispatcher Dispatcher `json:"dispatcher" help:"how expert parallelism moves tokens: all_to_all (torchtitan's, a row per top-k slot), deepep or hybridep (a row per destination rank)"`
	ExpertGEMM ExpertGEMM `json:"expert_gemm" help:"routed experts' matmul kernel: grouped_mm (torch._grouped_mm, torchtitan's) or cublas (TransformerEngine's GroupedLinear, one cuBLAS GEMM per expert)"`
	// FusedElementwise: the framework runs each elementwise op as one
	// fused kernel of its own (TransformerEngine / Megatron-Core fusions)
	// where eager PyTorch runs several.
	FusedElementwise bool `json:"fused_elementwise,omitempty" help:"the framework runs each elementwise op as one fused kernel (TransformerEngine/Megatron-Core fusions) instead of PyTorch's eager decomposition"`
	// FusedQKV runs the attention's q, k and v projections as one GEMM of
	// their concatenated width (torchtitan main's FusedQKVLinear).
	FusedQKV bool `json:"fused_qkv,omitempty" help:"one GEMM of the q, k and v projections' concatenated width instead of three (torchtitan main's FusedQKVLinear; grouped-query attention only)"`
	// CUDAGraphs is what the run captures in CUDA graphs (empty: none).
	CUDAGraphs CUDAGraphs `json:"cuda_graphs,omitempty" empty:"ok" help:"what is captured in CUDA graphs and replayed without host launches: {values} (layers: each block, Megatron-LM's per-layer graphs; full: a micro-step's forward and backward, torchtitan main's default; default: none)"`
	// Torch is the PyTorch release (the zero value: 2.9 or later).
	Torch TorchVersion `json:"torch_version,omitzero" help:"PyTorch release of the job, MAJOR.MINOR (default: 2.9 or later); before 2.9 eager RMSNorm is a composite of fp32 kernels"`
	// ExpertSkew ≥ 1 makes the most loaded expert-parallel rank receive
	// ExpertSkew × the mean rows; 0 or 1 is balanced routing.
	ExpertSkew float64 `json:"expert_skew,omitempty" help:"rows of the most loaded expert-parallel rank ÷ the mean (≥ 1; 0 = balanced routing)"`
	// CapacityFactor > 0 drops the routed rows over each expert's capacity
	// (Megatron-Core's --moe-expert-capacity-factor; 0: dropless, as
	// torchtitan) and PadToCapacity pads every expert to it
	// (--moe-pad-expert-input-to-capacity).
	CapacityFactor float64 `json:"capacity_factor,omitempty" help:"rows each expert keeps, × the balanced mean (Megatron-Core's --moe-expert-capacity-factor; 0 = dropless)"`
	PadToCapacity  bool    `json:"pad_to_capacity,omitempty" help:"pad every expert's rows to its capacity (Megatron-Core's --moe-pad-expert-input-to-capacity; needs --capacity-factor)"`
	// Routing is balanced, learned (a trained router's load from published
	// statistics: LearnedSkew) or a file of per-expert token counts
	// (Routing).
	Routing Routing `json:"routing,omitempty" empty:"ok" help:"the router's load: balanced (forced, the default), learned (a trained router's most loaded EP rank from published router statistics, with their spread in the interval) or a JSON file of per-expert token counts ({\"expert_counts\": [[per expert] per MoE layer]}, as train --json writes them) that the simulator replays"`
}

// DefaultRecipe is torchtitan's: bf16 training with FSDP2 mixed precision
// (fp32 parameters, gradients and AdamW moments, an fp32 cross-entropy;
// ReduceDType is left to Resolve, which reduces in the gradient type), compiled model and loss, expandable segments, fused
// AdamW, cuDNN attention, the all-to-all dispatcher and
// torch._grouped_mm experts.
func DefaultRecipe() Recipe {
	return Recipe{Precision: BF16, ParamDType: moe.F32, GradDType: moe.F32, OptimizerDType: moe.F32,
		LossDType: moe.F32, Compile: true, ExpandableSegments: true, Optimizer: FusedAdamW, Attention: CuDNNAttention,
		Dispatcher: AllToAll, ExpertGEMM: GroupedMM}
}

// EagerRecipe is DefaultRecipe without torch.compile (torchtitan's
// --compile=false, PyTorch's eager kernels).
func EagerRecipe() Recipe {
	r := DefaultRecipe()
	r.Compile = false
	return r
}

// Resolve fills what is left empty with its default (ReduceDType with
// GradDType) and validates.
func (r *Recipe) Resolve() error {
	d := DefaultRecipe()
	fill := func(dst *moe.DType, v moe.DType) {
		if *dst == "" {
			*dst = v
		}
	}
	fill(&r.ParamDType, d.ParamDType)
	fill(&r.GradDType, d.GradDType)
	fill(&r.ReduceDType, r.GradDType)
	fill(&r.OptimizerDType, d.OptimizerDType)
	fill(&r.LossDType, d.LossDType)
	orDefault(&r.Precision, d.Precision)
	orDefault(&r.Optimizer, d.Optimizer)
	orDefault(&r.Attention, d.Attention)
	orDefault(&r.Dispatcher, d.Dispatcher)
	orDefault(&r.ExpertGEMM, d.ExpertGEMM)
	return r.Validate()
}

func orDefault[T ~string](dst *T, v T) {
	if *dst == "" {
		*dst = v
	}
}

// Validate names every field out of its allowed values.
func (r Recipe) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if !slices.Contains(Precisions, r.Precision) {
		add(r.Precision.Check("precision")) // known but not priced is the predicting commands' to refuse
	}
	for _, f := range []struct {
		name string
		v    moe.DType
	}{ // reduce_dtype equal to a bad grad_dtype was derived from it: reported once
		{"param_dtype", r.ParamDType}, {"grad_dtype", r.GradDType}, {"reduce_dtype", r.ReduceDType},
		{"optimizer_dtype", r.OptimizerDType}, {"loss_dtype", r.LossDType}, {"master_dtype", r.MasterDType}} {
		if f.name == "master_dtype" && f.v == "" {
			continue
		}
		if f.v != moe.F32 && f.v != moe.BF16 && !(f.name == "reduce_dtype" && f.v == r.GradDType) {
			errs = append(errs, moe.FieldError{Field: f.name, Value: string(f.v), Allowed: "must be f32 or bf16"})
		}
	}
	add(r.CompileComponents.check())
	add(r.Quantize.check(r.Precision))
	if r.FP8AllGather && r.Precision != FP8Tensorwise {
		errs = append(errs, moe.FieldError{Field: "fp8_all_gather", Value: true, Allowed: "only with precision fp8-tensorwise (torchao's float8 all-gather casts with one scale per weight)"})
	}
	if r.FP8RowwiseGWHP && r.Precision != FP8Rowwise {
		errs = append(errs, moe.FieldError{Field: "fp8_rowwise_gw_hp", Value: true, Allowed: "only with precision fp8-rowwise (torchao's rowwise_with_gw_hp recipe)"})
	}
	if r.LossChunks < 0 || r.LossChunks > 1<<20 {
		errs = append(errs, moe.FieldError{Field: "loss_chunks", Value: r.LossChunks, Allowed: "must be in [1, 1048576] (0 = 1)"})
	}
	add(checkEnum("optimizer", r.Optimizer))
	add(checkEnum("attention_kernel", r.Attention))
	add(checkEnum("dispatcher", r.Dispatcher))
	add(checkEnum("expert_gemm", r.ExpertGEMM))
	if r.TransformerImpl != "" { // empty: torch, left out of JSON
		add(checkEnum("transformer_impl", r.TransformerImpl))
	}
	add(r.checkAutoModel())
	if r.LossImpl != "" {
		add(checkEnum("loss_impl", r.LossImpl))
	}
	if r.CUDAGraphs != "" {
		add(checkEnum("cuda_graphs", r.CUDAGraphs))
	}
	if r.DDPImpl != "" {
		add(checkEnum("ddp_impl", r.DDPImpl))
	}
	if r.ExpertSkew != 0 && !(r.ExpertSkew >= 1) || math.IsInf(r.ExpertSkew, 0) {
		errs = append(errs, moe.FieldError{Field: "expert_skew", Value: r.ExpertSkew, Allowed: "must be ≥ 1 and finite (0 = balanced)"})
	}
	add(r.Routing.check(r.ExpertSkew))
	if !(r.CapacityFactor >= 0) || math.IsInf(r.CapacityFactor, 0) {
		errs = append(errs, moe.FieldError{Field: "capacity_factor", Value: r.CapacityFactor, Allowed: "must be ≥ 0 and finite (0 = dropless)"})
	} else if r.PadToCapacity && r.CapacityFactor == 0 {
		errs = append(errs, moe.FieldError{Field: "pad_to_capacity", Value: true, Allowed: "needs a capacity_factor > 0 (dropless experts have no capacity)"})
	}
	return errors.Join(errs...)
}

// checkAutoModel refuses low precision under AutoModel's modules: its
// performance summary's recipes train in bf16 (from_config builds bf16
// parameters). What else its modules are not modelled with (compile,
// chunked or TE losses, checkpointing policies, layouts) the memory model
// refuses, which owns their tables (memory/automodel.go).
func (r Recipe) checkAutoModel() error {
	if r.TransformerImpl == AutoModelTransformer && r.Precision.LowPrecision() {
		return moe.FieldError{Field: "transformer_impl", Value: string(r.TransformerImpl), Allowed: "needs precision bf16 (AutoModel's low-precision modules are not modelled), not " + string(r.Precision)}
	}
	return nil
}

// GathersFP8In says whether the recipe's fp8 all-gather takes effect under
// layout l: torchtitan applies it only where FSDP shards the weights over
// more than one rank (enable_fsdp_float8_all_gather with dp_shard > 1).
func (r Recipe) GathersFP8In(l Layout) bool { return r.FP8AllGather && l.FSDPShards() }

// GathersFP8 says whether FSDP all-gathers parameter p in fp8: the recipe
// gathers in fp8 (FP8AllGather) and p is the weight of a linear it
// converts (torchao's float8 all-gather is Float8Linear's: the linear and
// output sets, never grouped experts).
func (r Recipe) GathersFP8(p moe.Param) bool {
	set, ok := GEMMSetOf(p)
	return ok && r.FP8AllGather && set != QuantExperts && r.Converts(set)
}

// Converted is the GEMM sets the recipe converts: Quantize, or the
// recipe's DefaultQuantize when it names none.
func (r Recipe) Converted() Quantize {
	if len(r.Quantize) > 0 {
		return r.Quantize
	}
	return DefaultQuantize(r.Precision)
}

// Converts says whether the recipe runs the GEMMs of set in low precision.
func (r Recipe) Converts(set GEMMSet) bool { return slices.Contains(r.Converted(), set) }

// Storage is the recipe's storage types as the memory model reads them:
// bf16 compute weights and activations (the only priced recipe, bf16),
// the rest as stated.
func (r Recipe) Storage() moe.Precision {
	return moe.Precision{Param: r.ParamDType, Compute: moe.BF16, Grad: r.GradDType, Optimizer: r.OptimizerDType, Activation: moe.BF16}
}

// Compiled says what torch.compile compiles: nothing when Compile is off,
// else the listed components (both when none is listed).
func (r Recipe) Compiled() (model, loss bool) {
	if !r.Compile {
		return false, false
	}
	if len(r.CompileComponents) == 0 {
		return true, true
	}
	return slices.Contains(r.CompileComponents, ModelComponent), slices.Contains(r.CompileComponents, LossComponent)
}

// Components lists what torch.compile compiles (torchtitan's
// compile.components).
type Components []Component

// Component is one entry of Components.
type Component string

// Compile components.
const (
	ModelComponent Component = "model"
	LossComponent  Component = "loss"
)

func (c Components) check() error {
	for _, v := range c {
		if err := checkEnum("compile_components", v); err != nil {
			return err
		}
	}
	return nil
}

// enum is a string type whose Values method lists its allowed values.
type enum interface {
	~string
	Values() []string
}

// checkEnum accepts v when it is one of its type's values.
func checkEnum[T enum](field string, v T) error {
	if slices.Contains(v.Values(), string(v)) {
		return nil
	}
	return moe.FieldError{Field: field, Value: string(v), Allowed: "must be one of " + strings.Join(v.Values(), ", ")}
}
