package sim

import (
	"fmt"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/epbuffer"
)

// CUDA graphs (job.CUDAGraphs): a captured kernel is launched by the
// graph's replay on the device, not by the host, so the launch floor the
// compute model puts under every kernel (cost.ComputeSpec.LaunchS, the
// host's launch path: parallel/hw/devices/b200.json's source measured a
// kernel at 28.3 µs launched directly and 25.8 µs replayed from a graph)
// is removed from the captured ops; what it would have cost is named in
// Breakdown.OverheadS as cuda_graphs_saved. The graphs keep their static
// buffers allocated for the whole run: memory's timeline holds them
// (memory/graphs.go, category cuda_graphs), which the replay includes.

// graphed says whether the run's CUDA graphs capture op record r: every
// op of the forward and backward under full graphs; under per-layer
// graphs the ops of the blocks, but for a MoE layer's routed experts
// unless they are padded to capacity (Megatron-LM d98e8a64,
// megatron/core/transformer/transformer_config.py: "moe cuda graph is only
// supported with drop-padding MoE", the dropless layer graphs only up to
// its router).
func graphed(cfg *moe.Config, in Input, r moe.OpRecord) bool {
	block := r.Layer >= 0 && r.Layer < cfg.Layers
	if !in.CUDAGraphs.Captures(block) {
		return false
	}
	return in.CUDAGraphs != job.LayerGraphs || !cfg.MoELayer[r.Layer] || r.Op.Kind() != moe.KindGrouped || in.PadToCapacity
}

// checkKnobs refuses, by name, the stack's settings the simulator cannot
// price for the run: fused QKV without grouped-query projections to fuse,
// and CUDA graphs where their capture is not modelled.
func checkKnobs(in Input) error {
	cfg := in.Model
	if in.FusedQKV && cfg != nil && (cfg.IsMLA() || cfg.KVHeads < 1 || cfg.Heads%cfg.KVHeads != 0) {
		return fmt.Errorf("simulate: --fused-qkv: %s has no grouped-query q, k and v projections to fuse (torchtitan main's FusedQKVLinear needs n_heads divisible by n_kv_heads and no latent attention)", cfg.ModelType)
	}
	switch g := in.CUDAGraphs; {
	case g == "" || g == job.NoGraphs:
	case in.Layout.Stages() > 1:
		return fmt.Errorf("simulate: --cuda-graphs %s with pp = %d is not modelled (graphs per stage and in-flight micro-batch); torchtitan main refuses it too (trainer.py, _validate_cuda_graphs)", g, in.Layout.Stages())
	case g == job.FullGraphs && in.Layout.EP > 1:
		return fmt.Errorf("simulate: --cuda-graphs full with ep = %d: the dispatch copies its split sizes to the host, which a graph cannot capture (torchtitan main b5bcd76, trainer.py _validate_cuda_graphs, refuses it but for HybridEP with a non-blocking capacity factor, which is not modelled); use --cuda-graphs layers", in.Layout.EP)
	}
	return nil
}

// CheckStack refuses, by name, the settings of s's stack the simulator
// cannot price at s's layout (the checks Simulate makes before any
// estimate): CUDA graphs and fused QKV where not modelled (checkKnobs), and
// DeepEP on an expert-parallel group it recommends no buffer config for
// (epbuffer.DeepEPBytes). A planner admits only the points it passes.
func CheckStack(s job.Spec) error {
	if err := checkKnobs(Input{Spec: s}); err != nil {
		return err
	}
	if s.Dispatcher == job.DeepEP && s.Layout.EP > 1 && s.Model != nil {
		if _, err := epbuffer.DeepEPBytes(s.Model.Hidden, s.Layout.EP); err != nil {
			return fmt.Errorf("simulate: %w", err)
		}
	}
	return nil
}
