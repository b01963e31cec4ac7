package numeric

import (
	"fmt"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/moetest"
)

// TestModulesPolicyTrainsAsNone: under Megatron's recompute modules the
// numeric ranks train bit for bit as under none on the same layout (the
// recompute repeats the same kernels on the same inputs; under moe the
// MoE layer's all-to-alls too), on FSDP 2 and HSDP × EP (2 × 2, ep 2),
// after three steps with accumulation.
func TestModulesPolicyTrainsAsNone(t *testing.T) {
	cfg := moetest.TinyMoE()
	none := moe.AC{Mode: moe.ACNone}
	for _, mods := range []moe.AC{{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoEAct},
		{Mode: moe.ACModules, Modules: moe.RecomputeMoE},
		{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoEAct | moe.RecomputeMoE}} {
		for _, tc := range []struct{ gpus, rep, ep int }{{2, 1, 1}, {4, 2, 2}} {
			l := moetest.FSDPLayout(t, tc.gpus, tc.rep, tc.ep)
			ra, pa, _ := numericRun(t, cfg, l, none, 1, 2, 3)
			rb, pb, _ := numericRun(t, cfg, l, mods, 1, 2, 3)
			compareRuns(t, fmt.Sprintf("gpus %d rep %d ep %d %s vs none", tc.gpus, tc.rep, tc.ep, mods), ra, rb, pa, pb, true, 0)
		}
	}
}
