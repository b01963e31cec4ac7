package sim

import (
	"encoding/json"
	"fmt"
	"sync"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe"
)

// maxRoutingBytes bounds a routing file: a few thousand experts over a
// hundred layers is well under a megabyte.
const maxRoutingBytes = 64 << 20

// routingFiles caches RoutingCounts by path: a search prices thousands of
// points against one file.
var routingFiles sync.Map

// RoutingCounts reads a routing file (job.Routing names it): a JSON object
// whose "expert_counts" holds, per MoE layer in order, the (token, slot)
// rows each routed expert received (train --json writes them, summed over
// its steps; other keys are ignored), or one row for every MoE layer. Only
// the shares matter: the simulated rank is, in each MoE layer, the
// expert-parallel rank those counts load most (expertLoads). A file that
// does not fit cfg is an error naming it and what is wrong.
func RoutingCounts(path string, cfg *moe.Config) ([][]int64, error) {
	if c, ok := routingFiles.Load(path); ok {
		return c.([][]int64), checkRouting(path, c.([][]int64), cfg)
	}
	data, err := fileio.ReadBounded(path, maxRoutingBytes)
	if err != nil {
		return nil, fmt.Errorf("routing: %w", err)
	}
	var f struct {
		ExpertCounts [][]int64 `json:"expert_counts"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("routing %s: %w", path, err)
	}
	routingFiles.Store(path, f.ExpertCounts)
	return f.ExpertCounts, checkRouting(path, f.ExpertCounts, cfg)
}

// checkRouting is checkExpertCounts on a file's counts, naming it.
func checkRouting(path string, counts [][]int64, cfg *moe.Config) error {
	if err := checkExpertCounts(counts, cfg); err != nil {
		return fmt.Errorf("routing %s: expert_counts: %w", path, err)
	}
	return nil
}

// checkExpertCounts accepts counts of cfg (Input.ExpertCounts): one row,
// or one per MoE layer, each of cfg's experts, none negative.
func checkExpertCounts(counts [][]int64, cfg *moe.Config) error {
	if n := len(counts); n != 1 && n != cfg.MoELayers() {
		return fmt.Errorf("expert counts for %d layers; want 1 or one per MoE layer (%d)", n, cfg.MoELayers())
	}
	for i, row := range counts {
		if len(row) != cfg.Experts {
			return fmt.Errorf("expert counts row %d has %d entries for %d experts", i, len(row), cfg.Experts)
		}
		for _, c := range row {
			if c < 0 {
				return fmt.Errorf("expert counts row %d: negative count %d", i, c)
			}
		}
	}
	return nil
}
