package moe

// Memory-budget checkpointing (torchtitan's activation_checkpoint.mode =
// "memory_budget", at v0.2.2 73a0e69 and main b5bcd76
// torchtitan/distributed/activation_checkpoint.py): torchtitan wraps no
// block; it sets torch._functorch.config.activation_memory_budget = F and
// lets AOTAutograd's partitioner choose what each compiled block keeps.
// PyTorch c28ba8e5 torch/_functorch/partitioners.py,
// choose_saved_values_set:
//
//   - F = 0 returns node_info.inputs: the graph's inputs alone, the
//     block's input (the weights are inputs under every F) — full
//     checkpointing of the block (AC.FullyCheckpointed).
//   - F = 1 returns the default min-cut (runtime_optimized_saved_values):
//     what the compiled block keeps without checkpointing, policy none
//     (memory's compiledBlock then removes the fused intermediates).
//   - In between, the memory of a set is normalized between those two,
//     (size − size(inputs)) / (size(default) − size(inputs)); the
//     compute-intensive ops the backward needs (get_default_op_list:
//     mm, bmm, addmm, SDPA, _scaled_mm) are the knapsack's items, each
//     weighing its output's size and worth its runtime, by default
//     (config.activation_memory_budget_runtime_estimator = "flops") the
//     FLOPs FlopCounterMode counts for that one op; the solver keeps the
//     items of most runtime within F (_optimize_runtime_with_given_memory,
//     default solver "dp", a quantized 0/1 knapsack) and the aggressive
//     min-cut recomputes everything else from the kept items and inputs.
//
// moescope applies this per block at its op granularity (Cache): the items
// are the block's linears whose output the backward reads and flash
// attention (output and log-sum-exp); what is kept is the block's input
// and the chosen items, the rest recomputed in backward, as the selective
// policy's cache does. Simplifications, named: the knapsack is solved
// exactly (the "dp" solver approximates that optimum); the router gate's
// mm (T·E outputs) is not an item and is recomputed, as under selective;
// the routed experts' grouped GEMMs are not items (_grouped_mm is not
// among get_default_op_list's compute-intensive ops at c28ba8e5, so the
// aggressive min-cut may recompute them) and are recomputed; the
// partitioner's intermediate "more aggressive" min-cuts, returned when
// they already fit F, are not distinguished from the knapsack's choice;
// and the normalization uses the eager table of policy none where
// PyTorch uses the compiled default's (smaller by the fused SwiGLU and
// norm intermediates memory's compiledBlock lists).

// Cache is what a caching policy keeps of a block besides its input; the
// block's backward recomputes its forward, taking these from the cache.
type Cache struct {
	Linears []Op // linears whose outputs are kept, in execution order
	Attn    bool // flash attention's output and log-sum-exp
	TopK    bool // the router's top-k values and indices (MoE blocks)
}

// Caches reports whether ac keeps blocks by a Cache: selective, and
// memory_budget:F with 0 < F < 1.
func (a AC) Caches() bool {
	return a.Mode == ACSelective || a.Mode == ACMemoryBudget && a.Budget > 0 && a.Budget < 1
}

// Cached returns the Cache of block l under ac for sequences of seq tokens
// with activations stored as act (only the memory budget's choice depends
// on seq and act), and false when ac keeps block l otherwise.
func (a AC) Cached(c *Config, l, seq int, act DType) (Cache, bool) {
	if !a.Caches() || a.FullyCheckpointed(l) || l < 0 || l >= len(c.MoELayer) {
		return Cache{}, false
	}
	if a.Mode == ACSelective {
		return Cache{Linears: SelectiveSaved(c, l), Attn: true, TopK: c.MoELayer[l]}, true
	}
	return budgetCache(c, l, seq, act, a.Budget), true
}

// budgetItem is one knapsack item of a block, per token: the bytes its
// output keeps and the FLOPs FlopCounterMode counts for the op.
type budgetItem struct {
	op           Op // a linear, or OpAttn
	bytes, flops int64
}

// budgetItems lists block l's items in execution order: its linears whose
// output the backward reads (not the dense MLP's down projection, nor the
// shared experts' without Qwen2-MoE's gate: their outputs only reach the
// block's output) and attention, FlopCounterMode's sdpa_flop (torch
// f34fa151 torch/utils/flop_counter.py: 2·b·h·s·s·d_qk + 2·b·h·s·s·d_v,
// "not accounting for causal attention"), per token 2·H·s·(d_qk + d_v).
func budgetItems(c *Config, l, seq int, act DType) []budgetItem {
	var items []budgetItem
	for _, op := range blockLinears(c, l) {
		if op == OpDenseDown || op == OpSharedDown && !c.SharedGated {
			continue
		}
		out := int64(linearOut(c, op))
		items = append(items, budgetItem{op, out * act.Bytes(), 2 * int64(linearIn(c, op)) * out})
		if op == OpVProj || op == OpKVBProj {
			items = append(items, attnItem(c, seq, act))
		}
	}
	return items
}

// attnItem is flash attention's item: output and lse, sdpa_flop per token.
func attnItem(c *Config, seq int, act DType) budgetItem {
	H := int64(c.Heads)
	bytes := H*int64(c.VHeadDim())*act.Bytes() + H*F32.Bytes()
	return budgetItem{OpAttn, bytes, 2 * H * int64(seq) * int64(c.HeadDim+c.VHeadDim())}
}

// linearIn is the input width of a block linear.
func linearIn(c *Config, op Op) int {
	switch op {
	case OpOProj:
		return c.Heads * c.VHeadDim()
	case OpQBProj:
		return c.MLA.QRank
	case OpKVBProj:
		return c.MLA.KVRank
	case OpSharedDown:
		return c.SharedExperts * c.SharedFFN
	}
	return c.Hidden
}

// budgetCache solves block l's knapsack for budget f in (0, 1): the items
// of most FLOPs whose bytes fit f × (bytes of policy none − the block's
// input), all per token (every record is T × a width, so T cancels);
// among equal FLOPs the fewer bytes, then the first in enumeration order.
func budgetCache(c *Config, l, seq int, act DType, f float64) Cache {
	p := DefaultPrecision
	p.Activation = act
	var max, min int64
	for i, r := range SavedTensors(c, l, 1, 1, AC{Mode: ACNone}, p) {
		max += r.Elements * r.DType.Bytes()
		if i == 0 { // the block's input, attn_norm's
			min = r.Elements * r.DType.Bytes()
		}
	}
	capacity := f * float64(max-min)
	items := budgetItems(c, l, seq, act)
	best, bestFLOPs, bestBytes := 0, int64(-1), int64(0)
	for mask := 0; mask < 1<<len(items); mask++ {
		var fl, by int64
		for i, it := range items {
			if mask&(1<<i) != 0 {
				fl, by = fl+it.flops, by+it.bytes
			}
		}
		if float64(by) <= capacity && (fl > bestFLOPs || fl == bestFLOPs && by < bestBytes) {
			best, bestFLOPs, bestBytes = mask, fl, by
		}
	}
	var cache Cache
	for i, it := range items {
		switch {
		case best&(1<<i) == 0:
		case it.op == OpAttn:
			cache.Attn = true
		default:
			cache.Linears = append(cache.Linears, it.op)
		}
	}
	return cache
}
