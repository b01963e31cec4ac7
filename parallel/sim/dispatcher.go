package sim

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// dispatchShare is the fraction of the (token, slot) rows the dispatcher
// sends: 1 for torchtitan's all-to-all of every row; for DeepEP's normal
// kernels (deepseek-ai/DeepEP, deep_ep/buffer.py: get_dispatch_layout
// returns is_token_in_rank and num_tokens_per_rank, and dispatch sends
// each token once to every EP rank that holds at least one of its experts;
// combine returns one row per (token, rank), reduced on the sender's side
// of the receiver), as Megatron-Core's flex dispatcher and NeMo
// AutoModel's deepep and hybridep dispatchers run them, the expected number
// of distinct EP ranks among a token's top-k experts over k, with k of E
// experts drawn without repetition, uniformly (balanced routing), from ep
// ranks of E/ep each: ep·(1 − C(E − E/ep, k)/C(E, k))/k.
func dispatchShare(d job.Dispatcher, cfg *moe.Config, ep int) float64 {
	E, k := cfg.Experts, cfg.TopK
	if !d.RowPerRank() || ep <= 1 || k <= 1 || E%ep != 0 {
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
