package sim

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// expertShare is the simulated rank's routed rows in one MoE layer
// relative to the balanced mean (T·K), and the relative sizes of its local
// expert groups (nil: even).
type expertShare struct {
	load   float64
	groups []float64
}

// expertLoads returns the simulated rank's share per MoE layer (absent:
// balanced) and the exactness statement.
func expertLoads(cfg *moe.Config, l job.Layout, in Input) (map[int]expertShare, string) {
	const sym = "one rank simulated: all ranks run the same program on same-shaped groups with balanced routing"
	if !cfg.IsMoE() {
		return nil, sym
	}
	loads := map[int]expertShare{}
	local := cfg.Experts / l.EP
	if len(in.ExpertCounts) > 0 {
		k, worst := 0, 1.0
		for layer := 0; layer < cfg.Layers; layer++ {
			if !cfg.MoELayer[layer] {
				continue
			}
			row := in.ExpertCounts[min(k, len(in.ExpertCounts)-1)]
			k++
			var total int64
			for _, c := range row {
				total += c
			}
			best, bestRows := 0, int64(-1)
			for r := 0; r < l.EP; r++ {
				var rows int64
				for _, c := range row[r*local : (r+1)*local] {
					rows += c
				}
				if rows > bestRows {
					best, bestRows = r, rows
				}
			}
			w := make([]float64, local)
			for i, c := range row[best*local : (best+1)*local] {
				w[i] = float64(c)
			}
			sh := expertShare{load: 1, groups: w}
			if mean := float64(total) / float64(l.EP); mean > 0 {
				sh.load = float64(bestRows) / mean
			}
			worst = math.Max(worst, sh.load)
			loads[layer] = sh
		}
		return loads, fmt.Sprintf("one rank simulated: in each MoE layer the EP rank receiving the most rows under the given counts (up to %.3f× the mean); exact because every all-to-all waits for it", worst)
	}
	if in.ExpertSkew > 1 && l.EP > 1 {
		for layer := 0; layer < cfg.Layers; layer++ {
			if cfg.MoELayer[layer] {
				loads[layer] = expertShare{load: in.ExpertSkew}
			}
		}
		return loads, fmt.Sprintf("one rank simulated: the most loaded EP rank (%.3g× the mean rows); exact when it is the most loaded in every MoE layer", in.ExpertSkew)
	}
	return nil, sym
}
