package moe

// What the reference implementation keeps from forward for backward, per
// op and checkpointing policy. It follows what PyTorch autograd keeps for
// torchtitan's graph of the same block (and HF's for the parts torchtitan
// lacks: the Qwen2-MoE shared-expert gate, the HF loss):
//
//   - plain ops, as torch 1.13's torch.autograd.graph.saved_tensors_hooks
//     report them (run on Debian's python3-torch 1.13.0a0): linear keeps its
//     input and weight (a parameter, not counted here); silu its input; mul
//     and div both operands; softmax and sigmoid their output; topk its
//     indices; gather its input and index; embedding the weight and ids;
//     cross_entropy the log-softmax output and the targets; index_select
//     (dispatch) its index; scatter_add (torchtitan's combine) its index.
//   - fused ops, from PyTorch's tools/autograd/derivatives.yaml:
//     _fused_rms_norm keeps input and rstd (result1, float32);
//     _scaled_dot_product_flash_attention keeps query, key, value, output
//     and logsumexp (float32); _grouped_mm keeps both operands.
//
// A tensor several ops read is kept (and listed) once, under its first
// reader: the attn_norm output under q_proj, the ffn_norm output under
// router (mlp_gate_proj in dense layers), the attention output (also
// o_proj's input) under attention. Activations are stored in the
// precision policy's activation type (bf16 by default); rstd, lse, router
// scores and weights and the log-probabilities are float32 as PyTorch keeps
// them; ids, labels and expert indices int64.
//
// Policy none (T tokens, q = H·d, kv = G·d, r = rstd rows, S shared width):
//
//	layer  op              tensor          elements         dtype
//	embed  embed           ids             T                i64
//	l      attn_norm       input, rstd     T·D, T           act, f32
//	l      q_proj          input           T·D              act
//	l      q_norm          input, rstd     T·q, T·H (head) or T (full)   act, f32
//	l      k_norm          input, rstd     T·kv, T·G or T   act, f32
//	l      attention       q, k, v, output T·q, T·kv, T·kv, T·q         act
//	l      attention       lse             T·H              f32
//	l      ffn_norm        input, rstd     T·D, T           act, f32
//	l      router          input           T·D              act   (mlp_gate_proj in dense layers)
//	l      router_topk     scores, indices T·E, T·K         f32, i64
//	l      router_topk     values, denominator  T·K, T      f32   (renormalized routers only)
//	l      dispatch        order           T·K              i64
//	l      expert_gate     input           T·K·D            act
//	l      expert_act      gate, silu_gate, up   T·K·F each act
//	l      expert_down     input           T·K·F            act
//	l      combine         expert_output, weights  T·K·D, T·K  act, f32
//	l      shared_act      gate, silu_gate, up   T·S each   act   (mlp_act in dense layers, width Fd)
//	l      shared_down_proj input          T·S              act   (mlp_down_proj)
//	l      shared_scale    gate, shared_output  T, T·D      act   (Qwen2-MoE only)
//	head   final_norm      input, rstd     T·D, T           act, f32
//	head   lm_head         input           T·D              act
//	head   loss            log_probs, labels  T·V, T        f32, i64
//
// Policy full, and the blocks layer:N checkpoints: the block keeps only
// attn_norm/input (its input) and recomputes its whole forward in backward.
//
// Policy selective (torchtitan's per-op SAC): the block keeps its input,
// the outputs of the linears selectiveSaved lists (every odd mm/linear
// counted over the block's calls, the router gate never counted nor saved),
// the attention output and lse, and the router's top-k values (f32, T·K)
// and indices (i64, T·K); grouped expert GEMMs are not saved. Backward
// re-executes every other forward op of the block (Recompute records), the
// cached ones being read from the cache.
//
// Embedding and head are never checkpointed (torchtitan wraps blocks only).

// blockLinears lists the block's mm/linear calls in execution order, the
// router gate excluded (torchtitan's policy neither counts nor saves it).
func blockLinears(c *Config, l int) []Op {
	ops := []Op{OpQProj, OpKProj, OpVProj, OpOProj}
	switch {
	case !c.MoELayer[l]:
		ops = append(ops, OpDenseGate, OpDenseUp, OpDenseDown)
	case c.SharedExperts > 0:
		ops = append(ops, OpSharedGate, OpSharedUp, OpSharedDown)
		if c.SharedGated {
			ops = append(ops, OpSharedExpGate)
		}
	}
	return ops
}

// selectiveSaved lists the linears whose outputs the selective policy
// keeps: the 1st, 3rd, 5th, … of blockLinears.
func selectiveSaved(c *Config, l int) []Op {
	var s []Op
	for i, op := range blockLinears(c, l) {
		if i%2 == 0 {
			s = append(s, op)
		}
	}
	return s
}

// linearOut is the output width of a block linear.
func linearOut(c *Config, op Op) int {
	switch op {
	case OpQProj:
		return c.Heads * c.HeadDim
	case OpKProj, OpVProj:
		return c.KVHeads * c.HeadDim
	case OpSharedGate, OpSharedUp:
		return c.SharedExperts * c.SharedFFN
	case OpDenseGate, OpDenseUp:
		return c.DenseFFN
	case OpSharedExpGate:
		return 1
	}
	return c.Hidden // o_proj, down projections
}

// SavedTensors is the analytic list of tensors the reference
// implementation keeps from forward for backward in one layer (LayerEmbed,
// a decoder layer, or c.LayerHead()) for a micro-batch of tokens tokens
// under policy ac, with activations stored as p.Activation (DefaultPrecision
// when p is zero). The table above states it; a test checks that execution
// records exactly this. A layer outside [LayerEmbed, c.LayerHead()] keeps
// nothing.
func SavedTensors(c *Config, layer, tokens int, ac AC, p Precision) []SavedRecord {
	if layer < LayerEmbed || layer > c.LayerHead() || len(c.MoELayer) != c.Layers {
		return nil
	}
	if p == (Precision{}) {
		p = DefaultPrecision
	}
	act := p.Activation
	T := int64(tokens)
	D, E, K := int64(c.Hidden), int64(c.Experts), int64(c.TopK)
	q, kv := int64(c.Heads*c.HeadDim), int64(c.KVHeads*c.HeadDim)
	var s []SavedRecord
	add := func(op Op, tensor string, n int64, dt DType) {
		s = append(s, SavedRecord{Layer: layer, Op: op, Tensor: tensor, Elements: n, DType: dt})
	}
	switch {
	case layer == LayerEmbed:
		add(OpEmbed, "ids", T, I64)
		return s
	case layer == c.LayerHead():
		add(OpFinalNorm, "input", T*D, act)
		add(OpFinalNorm, "rstd", T, F32)
		add(OpLMHead, "input", T*D, act)
		add(OpLoss, "log_probs", T*int64(c.Vocab), F32)
		add(OpLoss, "labels", T, I64)
		return s
	}
	add(OpAttnNorm, "input", T*D, act)
	moe := c.MoELayer[layer]
	switch {
	case ac.FullyCheckpointed(layer):
		return s
	case ac.Mode == ACSelective:
		for _, op := range selectiveSaved(c, layer) {
			add(op, "output", T*int64(linearOut(c, op)), act)
		}
		add(OpAttn, "output", T*q, act)
		add(OpAttn, "lse", T*int64(c.Heads), F32)
		if moe {
			add(OpRouterTopK, "values", T*K, F32)
			add(OpRouterTopK, "indices", T*K, I64)
		}
		return s
	}
	add(OpAttnNorm, "rstd", T, F32)
	add(OpQProj, "input", T*D, act)
	if c.QKNorm != QKNormNone {
		rq, rk := T*int64(c.Heads), T*int64(c.KVHeads)
		if c.QKNorm == QKNormFull {
			rq, rk = T, T
		}
		add(OpQNorm, "input", T*q, act)
		add(OpQNorm, "rstd", rq, F32)
		add(OpKNorm, "input", T*kv, act)
		add(OpKNorm, "rstd", rk, F32)
	}
	add(OpAttn, "q", T*q, act)
	add(OpAttn, "k", T*kv, act)
	add(OpAttn, "v", T*kv, act)
	add(OpAttn, "output", T*q, act)
	add(OpAttn, "lse", T*int64(c.Heads), F32)
	add(OpFFNNorm, "input", T*D, act)
	add(OpFFNNorm, "rstd", T, F32)
	if !moe {
		Fd := T * int64(c.DenseFFN)
		add(OpDenseGate, "input", T*D, act)
		add(OpDenseAct, "gate", Fd, act)
		add(OpDenseAct, "silu_gate", Fd, act)
		add(OpDenseAct, "up", Fd, act)
		add(OpDenseDown, "input", Fd, act)
		return s
	}
	F := T * K * int64(c.ExpertFFN)
	add(OpRouter, "input", T*D, act)
	add(OpRouterTopK, "scores", T*E, F32)
	add(OpRouterTopK, "indices", T*K, I64)
	if c.NormTopK {
		add(OpRouterTopK, "values", T*K, F32)
		add(OpRouterTopK, "denominator", T, F32)
	}
	add(OpDispatch, "order", T*K, I64)
	add(OpExpertGate, "input", T*K*D, act)
	add(OpExpertAct, "gate", F, act)
	add(OpExpertAct, "silu_gate", F, act)
	add(OpExpertAct, "up", F, act)
	add(OpExpertDown, "input", F, act)
	add(OpCombine, "expert_output", T*K*D, act)
	add(OpCombine, "weights", T*K, F32)
	if c.SharedExperts > 0 {
		S := T * int64(c.SharedExperts*c.SharedFFN)
		add(OpSharedAct, "gate", S, act)
		add(OpSharedAct, "silu_gate", S, act)
		add(OpSharedAct, "up", S, act)
		add(OpSharedDown, "input", S, act)
		if c.SharedGated {
			add(OpSharedScale, "gate", T, act)
			add(OpSharedScale, "shared_output", T*D, act)
		}
	}
	return s
}
