package plan

import (
	"errors"
	"fmt"

	"github.com/moescope/moescope/moe/job"
)

// RecipeExport is an export with what it writes of recipe r set: the
// compiled components, the storage types (Compile, Precision and
// ReduceDType) and the low-precision converters (Quant); the caller sets
// the rest.
func RecipeExport(r job.Recipe) TorchtitanExport {
	e := TorchtitanExport{Precision: r.Storage(), ReduceDType: r.ReduceDType, Quant: QuantOf(r), LossChunks: r.LossChunks, CUDAGraphs: r.CUDAGraphs,
		ForceBalance: r.Routing == job.RoutingBalanced}
	e.Compile.Model, e.Compile.Loss = r.Compiled()
	return e
}

// CheckRecipe refuses, naming each flag, the recipe settings target has no
// field for, which an export would otherwise drop silently: torchtitan at
// both pinned commits dispatches experts by all-to-all into
// torch._grouped_mm, runs PyTorch's own elementwise kernels, sets cuDNN
// first in its SDPA priority and builds fused AdamW; v0.2.2's job config
// has no chunked loss (main's registry does: the Python export writes its
// chunks). Storage types are CheckPrecision's; the
// low-precision recipe is CheckQuant's (the refusals that depend on the
// layout too are AdmitQuant's).
func (t TorchtitanTarget) CheckRecipe(r job.Recipe) error {
	d := job.DefaultRecipe()
	var errs []error
	refuse := func(on bool, flag string, v any) {
		if on {
			errs = append(errs, fmt.Errorf("--%s = %v: %s writes no field for it (torchtitan's is the default)", flag, v, t))
		}
	}
	refuse(r.Dispatcher != d.Dispatcher, "dispatcher", r.Dispatcher)
	refuse(r.ExpertGEMM != d.ExpertGEMM, "expert-gemm", r.ExpertGEMM)
	refuse(r.FusedElementwise, "fused-elementwise", r.FusedElementwise)
	refuse(r.LossChunks > 1 && t == TorchtitanTOML, "loss-chunks", r.LossChunks) // main's ChunkedLossWrapper (Python export)
	refuse(r.CapacityFactor > 0, "capacity-factor", r.CapacityFactor)            // torchtitan's MoE is dropless
	refuse(r.Routing.File() != "", "routing", r.Routing)                         // no replay of recorded counts
	refuse(r.Attention != d.Attention, "attention-kernel", r.Attention)
	refuse(r.Optimizer != d.Optimizer, "optimizer-impl", r.Optimizer)
	// Megatron-Core's storage and modules, which torchtitan does not build.
	refuse(r.MasterDType != "", "master-dtype", r.MasterDType)
	refuse(r.TransformerImpl != "" && r.TransformerImpl != job.TorchTransformer, "transformer-impl", r.TransformerImpl)
	refuse(r.LossImpl != "" && r.LossImpl != job.TorchLoss, "loss-impl", r.LossImpl)
	refuse(r.DDPImpl != "" && r.DDPImpl != job.TorchDDP, "ddp-impl", r.DDPImpl)
	// torchtitan v0.2.2 (73a0e69) has CUDA graphs only in
	// experiments/compiler_toolkit and no fused QKV; main (b5bcd76)
	// captures the whole forward and backward or nothing
	// (training.disable_cuda_graphs) and builds q, k and v fused or not by
	// model flavour in its registry (the fuse_qkv argument of
	// models/common/config_utils.py), which the export does not rewrite.
	if r.CUDAGraphs == job.LayerGraphs || (r.CUDAGraphs == job.FullGraphs && t == TorchtitanTOML) {
		errs = append(errs, fmt.Errorf("--cuda-graphs = %s: %s cannot express it (torchtitan v0.2.2 has no CUDA graphs for training; main captures the whole forward and backward or nothing)", r.CUDAGraphs, t))
	}
	if r.FusedQKV {
		errs = append(errs, fmt.Errorf("--fused-qkv: %s cannot express it (v0.2.2 has no FusedQKVLinear; main fuses q, k and v by model flavour in its registry, which the export does not rewrite)", t))
	}
	errs = append(errs, t.CheckQuant(QuantOf(r)))
	return errors.Join(errs...)
}

// pyGraphsLine sets torchtitan main's training.disable_cuda_graphs
// (b5bcd76 torchtitan/config/configs.py, False by default: the trainer
// wraps the forward and backward in wrap_with_cuda_graph) to the graphs
// the plan priced.
func pyGraphsLine(g job.CUDAGraphs) string {
	if g == job.FullGraphs {
		return "    config.training.disable_cuda_graphs = False  # captured, as priced (--cuda-graphs full)\n"
	}
	return "    config.training.disable_cuda_graphs = True  # launched from the host, as priced (--cuda-graphs none)\n"
}
