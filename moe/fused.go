package moe

import (
	"fmt"
	"strconv"
)

// Fused experts: GPT-OSS's checkpoint keeps each MoE layer's routed experts
// as four stacked tensors (GptOssExperts in modeling_gpt_oss.py,
// transformers 00d4b3d2):
//
//	experts.gate_up_proj       [E, D, 2F]  h = x·W_e (input-major), gate = h[..., 0::2], up = h[..., 1::2]
//	experts.gate_up_proj_bias  [E, 2F]
//	experts.down_proj          [E, F, D]   y = a·W_e
//	experts.down_proj_bias     [E, D]
//
// Params lists expert e's slice of each under the stacked name with "[e]"
// appended (gate_up_proj[e] is [D, 2F]), so that expert parallelism,
// sharding and memory see one tensor per expert as they do for the other
// model types. Gate and up stay interleaved column by column, as stored.

// tensorsPerExpert is the number of tensors Params lists per routed expert.
func (c *Config) tensorsPerExpert() int {
	n := 3
	if c.FusedExperts {
		n = 2
	}
	if c.ExpertBias {
		n *= 2
	}
	return n
}

// fusedExpertParams adds every routed expert's slices of the stacked
// tensors under prefix x ("model.layers.l.mlp.experts."). Tensor
// parallelism cuts the output features: gate_up_proj's columns (dim 1) with
// its bias, down_proj's input rows (dim 0); the down bias is added after
// the reduction, whole.
func (c *Config) fusedExpertParams(x string, l int, add paramAdder, split func(TPSplit)) {
	D, F := c.Hidden, c.ExpertFFN
	for e := 0; e < c.Experts; e++ {
		i := "[" + strconv.Itoa(e) + "]"
		add(x+"gate_up_proj"+i, GroupRouted, l, e, D, 2*F)
		split(TPDim1)
		if c.ExpertBias {
			add(x+"gate_up_proj_bias"+i, GroupRouted, l, e, 2*F)
			split(TPDim0)
		}
		add(x+"down_proj"+i, GroupRouted, l, e, F, D)
		split(TPDim0)
		if c.ExpertBias {
			add(x+"down_proj_bias"+i, GroupRouted, l, e, D)
		}
	}
}

// validateFused checks that the expert-only fields come with routed
// experts and that fused experts use no per-expert module names.
func (c *Config) validateFused(e *fieldErrors) {
	if c.MoELayers() > 0 {
		return
	}
	for _, f := range []struct {
		name string
		set  bool
	}{{"router_bias", c.RouterBias}, {"expert_bias", c.ExpertBias}, {"fused_experts", c.FusedExperts}} {
		if f.set {
			e.bad(f.name, true, "needs at least one MoE layer")
		}
	}
	if c.Clamp != nil {
		e.bad("swiglu_clamp", fmt.Sprint(*c.Clamp), "needs at least one MoE layer (it applies to routed experts)")
	}
}
