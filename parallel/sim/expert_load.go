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
	if len(in.ExpertCounts) > 0 {
		k, worst := 0, 1.0
		for layer := 0; layer < cfg.Layers; layer++ {
			if !cfg.MoELayer[layer] {
				continue
			}
			sh := countsShare(in.ExpertCounts[min(k, len(in.ExpertCounts)-1)], l.EP, in.Recipe)
			k++
			worst = math.Max(worst, sh.load)
			loads[layer] = sh
		}
		return loads, fmt.Sprintf("one rank simulated: in each MoE layer the EP rank receiving the most rows under the given counts (up to %.3f× the mean); exact because every all-to-all waits for it", worst)
	}
	skew := 1.0
	if r := in.RoutedSkew(); r > 1 && l.EP > 1 {
		skew = r
	}
	if load := capped(skew, in.Recipe); load != 1 {
		for layer := 0; layer < cfg.Layers; layer++ {
			if cfg.MoELayer[layer] {
				loads[layer] = expertShare{load: load}
			}
		}
		return loads, fmt.Sprintf("one rank simulated: the most loaded EP rank (%.3g× the mean rows%s); exact when it is the most loaded in every MoE layer", load, capacityNote(in.Recipe))
	}
	return nil, sym
}

// countsShare is the simulated rank's share of one MoE layer's counts row
// (every expert's rows): the EP rank the counts load most, its rows
// relative to the balanced mean (the row's total over ep) and its experts'
// relative sizes, each expert's rows capped by the capacity (capacityRows).
func countsShare(row []int64, ep int, r job.Recipe) expertShare {
	local := len(row) / ep
	var total int64
	for _, c := range row {
		total += c
	}
	kept := capacityRows(row, total, r)
	best, bestRows := 0, -1.0
	for rank := 0; rank < ep; rank++ {
		var rows float64
		for _, c := range kept[rank*local : (rank+1)*local] {
			rows += c
		}
		if rows > bestRows {
			best, bestRows = rank, rows
		}
	}
	sh := expertShare{load: 1, groups: kept[best*local : (best+1)*local]}
	if mean := float64(total) / float64(ep); mean > 0 {
		sh.load = bestRows / mean
	}
	return sh
}

// capacityRows is each expert's rows of row (total in all) that its
// capacity keeps: with a capacity factor F, Megatron-Core's token dropping
// keeps at most F × the balanced mean per expert (get_capacity:
// ⌈tokens·top-k / experts · F⌉, the rest dropped), and with padding every
// expert runs exactly that many (apply_router_token_dropping,
// pad_to_capacity; megatron/core/transformer/moe/moe_utils.py at
// NVIDIA/Megatron-LM d98e8a64). The cap applies per source rank there;
// counts summed over ranks are capped at F × their own mean, exact when the
// ranks route alike. Without a factor, every row is kept.
func capacityRows(row []int64, total int64, r job.Recipe) []float64 {
	out := make([]float64, len(row))
	limit := r.CapacityFactor * float64(total) / float64(len(row))
	for i, c := range row {
		switch {
		case r.CapacityFactor == 0:
			out[i] = float64(c)
		case r.PadToCapacity:
			out[i] = limit
		default:
			out[i] = math.Min(float64(c), limit)
		}
	}
	return out
}

// capped is a rank's load relative to the balanced mean under the
// capacity (capacityRows) when it would receive load × the mean: at most
// the factor, exactly it with padding (a rank's experts are capped alike).
func capped(load float64, r job.Recipe) float64 {
	switch {
	case r.CapacityFactor == 0:
		return load
	case r.PadToCapacity:
		return r.CapacityFactor
	}
	return math.Min(load, r.CapacityFactor)
}

// capacityNote says what the capacity did, for the exactness line.
func capacityNote(r job.Recipe) string {
	if r.CapacityFactor == 0 {
		return ""
	}
	if r.PadToCapacity {
		return fmt.Sprintf(", every expert padded to capacity factor %g", r.CapacityFactor)
	}
	return fmt.Sprintf(", rows over capacity factor %g dropped", r.CapacityFactor)
}

// CountsSkew is the most loaded expert-parallel rank's rows ÷ the mean in
// the worst MoE layer of counts (RoutingCounts' rows) on run s's layout,
// at most the layout's bound (job.Spec.MaxExpertSkew, which counts a
// router can record never exceed): what the memory model sizes a step by
// (it keeps one load for every layer, so where layers differ this bounds
// the loaded rank's memory from above).
func CountsSkew(counts [][]int64, s job.Spec) float64 {
	worst := 1.0
	if s.EP <= 1 {
		return worst
	}
	for _, row := range counts {
		worst = math.Max(worst, countsShare(row, s.EP, s.Recipe).load)
	}
	return math.Min(worst, max(s.MaxExpertSkew(), 1))
}

// memorySpec is the run whose memory the simulator replays: with recorded
// counts, that of the rank they load most in their worst layer
// (CountsSkew), which the memory model holds for every layer.
func memorySpec(s job.Spec, counts [][]int64) job.Spec {
	if len(counts) > 0 {
		s.Routing, s.ExpertSkew = job.RoutingBalanced, CountsSkew(counts, s)
	}
	return s
}
