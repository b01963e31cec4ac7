package numeric

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/moetest"
)

// TestNumericMLA: a DeepSeek-V3-shaped tiny model (multi-head latent
// attention with a query latent and value heads narrower than q·k,
// interleaved RoPE, sigmoid grouped routing with a selection bias, a shared
// expert) trains on FSDP and expert-parallel ranks as on one rank: the
// latent projections and norms are sharded, gathered and reduced like any
// other layer tensor.
func TestNumericMLA(t *testing.T) {
	cfg := moetest.TinyMoE()
	cfg.ModelType, cfg.KVHeads, cfg.HeadDim, cfg.QKNorm = "deepseek_v3", cfg.Heads, 5, moe.QKNormNone
	cfg.MLA = moe.MLA{QRank: 3, KVRank: 4, Nope: 3, Rope: 2, V: 2, NormEps: 1e-6}
	cfg.RopeInterleave = true
	cfg.Score, cfg.SelectionBias, cfg.RoutedScale, cfg.NormTopKEps = moe.Sigmoid, true, 2.5, 1e-20
	cfg.AuxLossCoef, cfg.OutputRouterLogits = 0, false
	cfg.Groups, cfg.TopKGroups = 2, 1
	cfg.SharedExperts, cfg.SharedFFN = 1, 6
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	trainsAsOneRank(t, "mla", cfg, []rankCase{{2, 1, 1, 2, true, 1, 1}, {4, 2, 2, 1, false, 1, 1}})
}
