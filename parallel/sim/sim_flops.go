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
	t, err := flops.Count(cfg, flops.Shape{Seq: in.Seq, Batch: in.LBS}, in.AC, flops.DefaultTile)
	if err != nil {
		return nil, 0, fmt.Errorf("simulate: flops: %w", err)
	}
	out := make(map[string]float64, len(t.PerToken))
	for c, v := range t.PerToken {
		out[string(c)] = v
	}
	return out, t.PerToken[flops.Hardware], nil
}
