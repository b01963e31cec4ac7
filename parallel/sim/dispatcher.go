package sim

import (
	"fmt"

	"github.com/moescope/moescope/moe"
)

// Dispatcher is how expert parallelism moves tokens to the ranks that hold
// their experts.
type Dispatcher string

const (
	// AllToAllDispatch is torchtitan's: one all_to_all_single of every
	// (token, top-k slot) row, the rows a rank keeps included.
	AllToAllDispatch Dispatcher = ""
	// DeepEPDispatch is DeepEP's normal kernels (deepseek-ai/DeepEP,
	// deep_ep/buffer.py: get_dispatch_layout returns is_token_in_rank and
	// num_tokens_per_rank, and dispatch sends each token once to every EP
	// rank that holds at least one of its experts; combine returns one row
	// per (token, rank), reduced on the sender's side of the receiver), as
	// Megatron-Core's flex dispatcher and NeMo AutoModel's deepep and
	// hybridep dispatchers run them.
	DeepEPDispatch Dispatcher = "deepep"
)

// ParseDispatcher reads a run's or flag's dispatcher: "" or "all_to_all"
// (torchtitan's), "deepep" (also "hybridep", DeepEP's hybrid kernels with
// the same per-rank deduplication).
func ParseDispatcher(field, s string) (Dispatcher, error) {
	switch s {
	case "", "all_to_all":
		return AllToAllDispatch, nil
	case "deepep", "hybridep":
		return DeepEPDispatch, nil
	}
	return "", fmt.Errorf("%s = %q: must be all_to_all (torchtitan's), deepep or hybridep", field, s)
}

// dispatchShare is the fraction of the (token, slot) rows the dispatcher
// sends: 1 for an all-to-all of every row; for DeepEP the expected number
// of distinct EP ranks among a token's top-k experts over k, with k of E
// experts drawn without repetition, uniformly (balanced routing), from ep
// ranks of E/ep each: ep·(1 − C(E − E/ep, k)/C(E, k))/k.
func dispatchShare(d Dispatcher, cfg *moe.Config, ep int) float64 {
	E, k := cfg.Experts, cfg.TopK
	if d != DeepEPDispatch || ep <= 1 || k <= 1 || E%ep != 0 {
		return 1
	}
	// C(E − E/ep, k)/C(E, k) = Π_{i<k} (E − E/ep − i)/(E − i).
	miss := 1.0
	for i := range k {
		miss *= float64(E-E/ep-i) / float64(E-i)
		if miss <= 0 {
			miss = 0
			break
		}
	}
	return float64(ep) * (1 - miss) / float64(k)
}
