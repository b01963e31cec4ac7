package moe

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ACMode is an activation-checkpointing mode.
type ACMode string

// Checkpointing modes, with torchtitan's semantics.
const (
	ACNone ACMode = "none"
	// ACSelective is torchtitan's per-op policy: outputs of mm/linear are
	// saved except every second one counted over the block's mm/linear calls;
	// the router-gate mm is never saved and does not advance the count;
	// attention outputs, router top-k values and indices and communication
	// outputs are saved; grouped expert GEMMs are not in the save list.
	ACSelective ACMode = "selective"
	// ACFull keeps only each block's input and recomputes the block in backward.
	ACFull ACMode = "full"
	// ACLayer fully checkpoints blocks i with (i+1) mod Every == 0.
	ACLayer ACMode = "layer"
	// ACModules is Megatron-Core's module-level selective recompute
	// (--recompute-granularity selective --recompute-modules M…): the
	// outputs of the named modules are discarded once their consumers
	// have run and recomputed in backward; everything else is kept as
	// under none. See RecomputeModules.
	ACModules ACMode = "modules"
	// ACMemoryBudget is torchtitan's mode = "memory_budget": the compiler's
	// partitioner chooses what each compiled block keeps under a budget
	// Budget in [0, 1] (budget.go).
	ACMemoryBudget ACMode = "memory_budget"
)

// AC is a checkpointing policy.
type AC struct {
	Mode    ACMode
	Every   int              // N of layer:N
	Modules RecomputeModules // the modules of modules:M,… (Mode ACModules)
	Budget  float64          // F of memory_budget:F, in [0, 1] (Mode ACMemoryBudget)
}

// RecomputeModules is a set of Megatron-Core recompute modules.
//
// Megatron-LM d98e8a6 (2026-08-22), megatron/core/transformer/
// transformer_config.py, recompute_modules, allows "core_attn", "moe_act",
// "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts" (and four
// for architectures moescope lacks). "layernorm" and "moe_act" run
// their module under tensor_parallel.CheckpointWithoutOutput
// (tensor_parallel/random.py): forward without autograd, so the module
// itself saves nothing; its inputs saved for the recompute; its output's
// storage freed once the consumer has run (discard_output_and_register_recompute,
// after the consumer's forward) and rebuilt, with autograd, by a hook on
// the gradient of the consumer's output, at the start of that consumer's
// backward. The consumer still holds its input as a view of the freed
// storage, which the recompute refills.
//
//   - RecomputeLayerNorm ("layernorm"): input_layernorm and
//     pre_mlp_layernorm, where the layer has them as modules
//     (transformer_layer.py: recompute_input_layernorm only when the norm
//     is not IdentityOp). Megatron-Core's default layer spec (TE,
//     models/gpt/gpt_layer_specs.py) fuses input_layernorm into linear_qkv
//     (TELayerNormColumnParallelLinear) for standard attention and the
//     dense MLP's norm into linear_fc1, and keeps them separate only for
//     MLA's input norm and the MoE layers' pre-MLP norm. So it recomputes
//     ffn_norm in MoE blocks and attn_norm in MLA blocks: their output
//     (the router's / q projection's input) and rstd are not kept; the
//     norm's input, the residual, is kept as under none. (Megatron turns
//     the pre-MLP norm's recompute off when TE CUDA graphs capture the MoE
//     router, unless they also capture the preprocess with the alltoall
//     dispatcher: can_recompute_pre_mlp_layernorm_for_cudagraph. Such a
//     run is modules:moe_act.)
//   - RecomputeMoEAct ("moe_act"): the routed experts' activation
//     (moe/experts.py, TEGroupedMLP: bias_act_func between linear_fc1 and
//     linear_fc2): the experts keep fc1's output (gate and up) and drop
//     silu(gate) and silu(gate)·up, the down projection's input. Shared
//     experts and dense MLPs (transformer/mlp.py) have no such option.
//   - RecomputeMoE ("moe"): the whole MoE layer (moe/moe_layer.py,
//     MoELayer.forward: with "moe" in recompute_modules its custom_forward,
//     the shared experts, the router, the token permutation, the dispatch
//     all-to-all, the experts, the combine all-to-all and the shared
//     output's add, runs under tensor_parallel.checkpoint, random.py's
//     CheckpointFunction): forward without autograd, only the layer's
//     input, the pre-MLP norm's output, saved (save_for_backward); at the
//     start of the layer's backward the whole forward runs again with
//     autograd, its all-to-alls included, and backward goes through it.
//     Nothing inside the layer is kept between forward and backward; the
//     pre-MLP norm outside it keeps its input and rstd as under none. With
//     layernorm too, that saved input is the norm's discarded output,
//     rebuilt by the norm's recompute before the layer's (the norm's hook
//     is on the layer's output gradient). With moe_act too, the activation
//     is discarded again inside the recomputed forward and rebuilt before
//     the down projection's backward: computed three times. Megatron's
//     config accepts every combination of the three
//     (transformer_config.py __post_init__ refuses moe only beside
//     offloading inside the layer, overlap_moe_expert_parallel_comm and
//     some CUDA-graph scopes, none of which moescope models).
//
// The other modules checkpoint whole submodules and are not built.
type RecomputeModules uint8

// The recompute modules moescope builds, as bits of RecomputeModules.
const (
	RecomputeLayerNorm RecomputeModules = 1 << iota
	RecomputeMoEAct
	RecomputeMoE
)

// recomputeModuleNames are the built modules in the order String prints
// them; megatronOnlyModules Megatron's others, refused by name.
var (
	recomputeModuleNames = []struct {
		m    RecomputeModules
		name string
	}{{RecomputeLayerNorm, "layernorm"}, {RecomputeMoEAct, "moe_act"}, {RecomputeMoE, "moe"}}
	megatronOnlyModules = []string{"core_attn", "mla_up_proj", "mlp", "shared_experts",
		"gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc"}
)

// builtModules lists the built module names for error messages.
func builtModules() string {
	var s []string
	for _, n := range recomputeModuleNames {
		s = append(s, n.name)
	}
	return strings.Join(s, ", ")
}

// ParseAC reads none|selective|full|layer:N|modules:M,…|memory_budget:F
// (M among RecomputeModules' names, each once; F in [0, 1]).
func ParseAC(s string) (AC, error) {
	switch ACMode(s) {
	case ACNone, ACSelective, ACFull:
		return AC{Mode: ACMode(s)}, nil
	}
	if rest, ok := strings.CutPrefix(s, "layer:"); ok {
		n, err := strconv.Atoi(rest)
		if err == nil && n >= 1 {
			return AC{Mode: ACLayer, Every: n}, nil
		}
		return AC{}, fmt.Errorf("ac = %q: layer:N needs an integer N ≥ 1", s)
	}
	if rest, ok := strings.CutPrefix(s, "modules:"); ok {
		var set RecomputeModules
		for _, name := range strings.Split(rest, ",") {
			m, err := parseModule(name)
			if err != nil {
				return AC{}, fmt.Errorf("ac = %q: %w", s, err)
			}
			if set&m != 0 {
				return AC{}, fmt.Errorf("ac = %q: module %q named twice", s, name)
			}
			set |= m
		}
		return AC{Mode: ACModules, Modules: set}, nil
	}
	if rest, ok := strings.CutPrefix(s, "memory_budget:"); ok {
		f, err := strconv.ParseFloat(rest, 64)
		if err != nil || !(f >= 0 && f <= 1) {
			return AC{}, fmt.Errorf("ac = %q: memory_budget:F needs a number F in [0, 1]", s)
		}
		return AC{Mode: ACMemoryBudget, Budget: f}, nil
	}
	return AC{}, fmt.Errorf("ac = %q: must be none, selective, full, layer:N, modules:M,… (M among %s) or memory_budget:F (F in [0, 1])", s, builtModules())
}

// parseModule reads one recompute module's name.
func parseModule(name string) (RecomputeModules, error) {
	for _, n := range recomputeModuleNames {
		if n.name == name {
			return n.m, nil
		}
	}
	if slices.Contains(megatronOnlyModules, name) {
		return 0, fmt.Errorf("Megatron-Core recompute module %q is not built; built: %s", name, builtModules())
	}
	return 0, fmt.Errorf("%q is not a Megatron-Core recompute module; built: %s", name, builtModules())
}

// Validate reports a policy no model can run: layer:N with N < 1, the
// modules policy without a module, or a memory budget outside [0, 1].
func (a AC) Validate() error {
	switch {
	case a.Mode == ACLayer && a.Every < 1:
		return fmt.Errorf("ac = %s: layer:N needs N ≥ 1", a)
	case a.Mode == ACModules && a.Modules == 0:
		return fmt.Errorf("ac = modules: needs at least one module (%s)", builtModules())
	case a.Mode == ACMemoryBudget && !(a.Budget >= 0 && a.Budget <= 1):
		return fmt.Errorf("ac = %s: memory_budget:F needs F in [0, 1]", a)
	}
	return nil
}

func (a AC) String() string {
	switch a.Mode {
	case ACLayer:
		return fmt.Sprintf("layer:%d", a.Every)
	case ACModules:
		var s []string
		for _, n := range recomputeModuleNames {
			if a.Modules&n.m != 0 {
				s = append(s, n.name)
			}
		}
		return "modules:" + strings.Join(s, ",")
	case ACMemoryBudget:
		return "memory_budget:" + strconv.FormatFloat(a.Budget, 'g', -1, 64)
	}
	return string(a.Mode)
}

// MarshalText writes the policy as ParseAC reads it.
func (a AC) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText reads the policy with ParseAC.
func (a *AC) UnmarshalText(b []byte) error {
	p, err := ParseAC(string(b))
	*a = p
	return err
}

// FullyCheckpointed reports whether block i is wrapped whole (only its
// input kept): full, the blocks of layer:N, and memory_budget:0 (the
// partitioner keeps the graph's inputs alone, budget.go).
func (a AC) FullyCheckpointed(i int) bool {
	switch a.Mode {
	case ACFull:
		return true
	case ACMemoryBudget:
		return a.Budget == 0
	case ACLayer:
		return (i+1)%a.Every == 0
	}
	return false
}

// NormRecomputed reports whether block l's norm op (OpAttnNorm or
// OpFFNNorm) is recomputed by the layernorm module: ffn_norm in MoE blocks,
// attn_norm in MLA blocks (RecomputeModules says why these).
func (a AC) NormRecomputed(c *Config, l int, op Op) bool {
	if a.Mode != ACModules || a.Modules&RecomputeLayerNorm == 0 || l < 0 || l >= len(c.MoELayer) {
		return false
	}
	switch op {
	case OpAttnNorm:
		return c.IsMLA()
	case OpFFNNorm:
		return c.MoELayer[l]
	}
	return false
}

// ActRecomputed reports whether block l's routed-expert activation is
// recomputed by the moe_act module (MoE blocks only).
func (a AC) ActRecomputed(c *Config, l int) bool {
	return a.Mode == ACModules && a.Modules&RecomputeMoEAct != 0 && l >= 0 && l < len(c.MoELayer) && c.MoELayer[l]
}

// MoERecomputed reports whether block l's MoE layer (router, dispatch,
// experts, combine, shared experts) is recomputed whole by the moe module
// (MoE blocks only).
func (a AC) MoERecomputed(c *Config, l int) bool {
	return a.Mode == ACModules && a.Modules&RecomputeMoE != 0 && l >= 0 && l < len(c.MoELayer) && c.MoELayer[l]
}

// InMoELayer reports whether op, in a MoE block, runs inside Megatron's
// MoELayer, the part the moe module recomputes: the router, its top-k,
// dispatch, the routed experts, combine and the shared experts (the
// pre-MLP norm, the residual adds and the aux loss, computed from the
// scores after the blocks, are outside).
func InMoELayer(op Op) bool {
	switch op {
	case OpRouter, OpRouterTopK, OpDispatch, OpExpertGate, OpExpertUp, OpExpertAct, OpExpertDown, OpCombine,
		OpSharedGate, OpSharedUp, OpSharedAct, OpSharedDown, OpSharedExpGate, OpSharedScale:
		return true
	}
	return false
}
