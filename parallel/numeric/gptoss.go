package numeric

import (
	"fmt"
	"strings"

	"github.com/moescope/moescope/moe"
)

// refuseGPTOSS names the GPT-OSS and Llama 4 fields the ranks do not run
// yet: moe/ref executes them on one process (grad), but the ranks' expert
// units list three tensors per expert (expertParamIndex), their
// expert-parallel stage runs the plain SwiGLU, the tensor-parallel block
// knows neither the sinks nor the o_proj bias, and the context-parallel
// exchange has no chunk mask, so train would compute another model.
func refuseGPTOSS(c *moe.Config) error {
	var set []string
	for _, f := range []struct {
		name string
		on   bool
	}{{"attn_sinks", c.AttnSinks}, {"o_proj_bias", c.OProjBias}, {"router_bias", c.RouterBias},
		{"expert_bias", c.ExpertBias}, {"swiglu_clamp", c.Clamp != nil}, {"fused_experts", c.FusedExperts}} {
		if f.on {
			set = append(set, f.name)
		}
	}
	if set = append(set, c.Llama4Fields()...); set == nil {
		return nil
	}
	return fmt.Errorf("%s: %s: not run by the numeric ranks (train) yet; grad runs them on one process", c.Name, strings.Join(set, ", "))
}
