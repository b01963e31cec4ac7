package moe

// Precision is a mixed-precision policy: the storage type of each kind of
// state on a GPU. The default is torchtitan's FSDP2 mixed precision.
type Precision struct {
	Param      DType // sharded master parameters
	Compute    DType // all-gathered weights used by forward and backward
	Grad       DType // reduce-scattered gradients
	Optimizer  DType // each AdamW moment
	Activation DType // activations saved for backward
}

// DefaultPrecision is torchtitan FSDP2 mixed precision: fp32 sharded
// parameters, bf16 compute weights, fp32 gradients, fp32 AdamW moments, bf16
// activations (torchtitan MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)).
var DefaultPrecision = Precision{Param: F32, Compute: BF16, Grad: F32, Optimizer: F32, Activation: BF16}

// ReferencePrecision stores every kind of state in float32, as the CPU
// reference implementation does: what sizing its host memory needs.
var ReferencePrecision = Precision{Param: F32, Compute: F32, Grad: F32, Optimizer: F32, Activation: F32}
