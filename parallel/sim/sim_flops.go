package sim

import (
	"fmt"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe"
)

// flopsPerToken returns FLOPs per token under every convention of the flops
// package, and the hardware count (recompute under in.AC and the GPU
// flash-attention tile) for HFU.
func flopsPerToken(cfg *moe.Config, in Input) (map[string]float64, float64, error) {
	// Per-token counts do not depend on the batch (every sequence costs
	// the same), so one sequence is counted: a long-context step's total
	// (R148: 256 sequences of 131072 tokens of Qwen3-235B) overflows int64.
	t, err := flops.Count(cfg, flops.Shape{Seq: in.Seq, Batch: 1}, in.AC, flops.DefaultTile)
	if err != nil {
		return nil, 0, fmt.Errorf("simulate: flops: %w", err)
	}
	out := make(map[string]float64, len(t.PerToken))
	for c, v := range t.PerToken {
		out[string(c)] = v
	}
	return out, t.PerToken[flops.Hardware], nil
}
