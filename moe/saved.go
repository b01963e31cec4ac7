package moe

import "slices"

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
// Under MLA (mla.go) the attention rows are: q_proj or q_a_proj input
// T·D (the normed input, which kv_a_proj_with_mqa also reads); q_a_norm
// input T·Rq, rstd T; q_b_proj input T·Rq; kv_a_norm input T·Rkv, rstd T;
// kv_b_proj input T·Rkv; attention q and k T·H·(nope+rope), v and output
// T·H·v, lse T·H. RoPE keeps nothing.
//
// Policy full, and the blocks layer:N checkpoints: the block keeps only
// attn_norm/input (its input) and recomputes its whole forward in backward.
//
// Policy selective (torchtitan's per-op SAC): the block keeps its input,
// the outputs of the linears SelectiveSaved lists (every odd mm/linear
// counted over the block's calls, the router gate never counted nor saved),
// the attention output and lse, and the router's top-k values (f32, T·K)
// and indices (i64, T·K); grouped expert GEMMs are not saved. Backward
// re-executes every other forward op of the block (Recompute records), the
// cached ones being read from the cache.
//
// Policy memory_budget:F (budget.go): F = 0 as full, F = 1 as none, in
// between the block's input and the knapsack's Cache: the outputs of the
// chosen linears and, when chosen, the attention output and lse; the
// router's top-k is recomputed.
//
// Policy modules (Megatron-Core's recompute modules, RecomputeModules):
// the table of none without the tensors the named modules rebuild in
// backward. layernorm: in MoE blocks ffn_norm's rstd and output (the
// router input; mlp_gate_proj's in dense blocks is never dropped), in MLA
// blocks attn_norm's rstd and output (the q_proj or q_a_proj input);
// moe_act: the routed experts' silu_gate and expert_down input; moe: in
// MoE blocks every row of the MoE layer (router_topk, dispatch, the
// experts, combine, the shared experts) but the router's input, the
// layer's input (which layernorm drops too). Backward re-executes those
// ops (Recompute records): the norm before its consumer's backward, the
// MoE layer's forward before its backward, the activation before
// expert_down's (under moe and moe_act both: in forward, in the layer's
// recompute and once more before expert_down's backward).
//
// Embedding and head are never checkpointed (torchtitan wraps blocks only).

// blockLinears lists the block's mm/linear calls in execution order, the
// router gate excluded (torchtitan's policy neither counts nor saves it).
func blockLinears(c *Config, l int) []Op {
	ops := []Op{OpQProj, OpKProj, OpVProj, OpOProj}
	if c.IsMLA() {
		ops = mlaLinears(c)
	}
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

// SelectiveSaved lists the linears of block l whose outputs the selective
// policy keeps: the 1st, 3rd, 5th, … of the block's mm/linear calls in
// execution order, the router gate neither counted nor kept. SavedTensors
// lists their outputs and the reference implementation (moe/ref) caches
// them: one rule for both.
func SelectiveSaved(c *Config, l int) []Op {
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
	case OpQProj, OpQBProj:
		return c.Heads * c.HeadDim
	case OpQAProj:
		return c.MLA.QRank
	case OpKVAProj:
		return c.MLA.KVRank + c.MLA.Rope
	case OpKVBProj:
		return c.Heads * (c.MLA.Nope + c.MLA.V)
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
// a decoder layer, or c.LayerHead()) for a micro-batch of batch sequences
// of seq tokens under policy ac, with activations stored as p.Activation (DefaultPrecision
// when p is zero). The table above states it; a test checks that execution
// records exactly this. A layer outside [LayerEmbed, c.LayerHead()] keeps
// nothing.
func SavedTensors(c *Config, layer, batch, seq int, ac AC, p Precision) []SavedRecord {
	if layer < LayerEmbed || layer > c.LayerHead() || len(c.MoELayer) != c.Layers {
		return nil
	}
	if p == (Precision{}) {
		p = DefaultPrecision
	}
	s := &savedList{c: c, layer: layer, T: int64(batch) * int64(seq), act: p.Activation}
	switch {
	case layer == LayerEmbed:
		s.add(OpEmbed, SavedIDs, s.T, I64)
	case layer == c.LayerHead():
		s.head()
	default:
		// The block's input, which every policy keeps.
		s.add(OpAttnNorm, SavedInput, s.T*int64(c.Hidden), s.act)
		cache, cached := ac.Cached(c, layer, seq, p.Activation)
		switch {
		case ac.FullyCheckpointed(layer):
		case cached:
			s.cached(cache)
		default:
			s.attention()
			s.ffn()
			s.dropRecomputed(ac)
		}
	}
	return s.rs
}

// dropRecomputed removes, under the modules policy, the tensors its
// modules recompute in backward instead of keeping.
func (s *savedList) dropRecomputed(ac AC) {
	if ac.Mode != ACModules {
		return // no module recomputes anything: keep all
	}
	c, l := s.c, s.layer
	drop := map[SavedRecord]bool{}
	mark := func(op Op, tensor Saved) { drop[SavedRecord{Op: op, Tensor: tensor}] = true }
	if ac.NormRecomputed(c, l, OpAttnNorm) {
		mark(OpAttnNorm, SavedRstd)
		mark(OpQProj, SavedInput)
		mark(OpQAProj, SavedInput)
	}
	if ac.NormRecomputed(c, l, OpFFNNorm) {
		mark(OpFFNNorm, SavedRstd)
		mark(OpRouter, SavedInput)
	}
	if ac.ActRecomputed(c, l) {
		mark(OpExpertAct, SavedSiLUGate)
		mark(OpExpertDown, SavedInput)
	}
	moeLayer := ac.MoERecomputed(c, l)
	s.rs = slices.DeleteFunc(s.rs, func(r SavedRecord) bool {
		// moe keeps the layer's input, listed under the router.
		inside := moeLayer && InMoELayer(r.Op) && !(r.Op == OpRouter && r.Tensor == SavedInput)
		return inside || drop[SavedRecord{Op: r.Op, Tensor: r.Tensor}]
	})
}

// savedList accumulates the records of one layer for SavedTensors: T
// tokens, activations stored as act.
type savedList struct {
	c     *Config
	layer int
	T     int64
	act   DType
	rs    []SavedRecord
}

func (s *savedList) add(op Op, tensor Saved, n int64, dt DType) {
	s.rs = append(s.rs, SavedRecord{Layer: s.layer, Op: op, Tensor: tensor, Elements: n, DType: dt})
}

// head adds the final norm's, the LM head's and the loss's tensors.
func (s *savedList) head() {
	T, D := s.T, int64(s.c.Hidden)
	s.add(OpFinalNorm, SavedInput, T*D, s.act)
	s.add(OpFinalNorm, SavedRstd, T, F32)
	s.add(OpLMHead, SavedInput, T*D, s.act)
	s.add(OpLoss, SavedLogProbs, T*int64(s.c.Vocab), F32)
	s.add(OpLoss, SavedLabels, T, I64)
}

// cached adds what a caching policy keeps beyond the block's input (AC.
// Cached): the outputs of the cached linears, the attention output and
// lse, and the router's top-k values and indices.
func (s *savedList) cached(cache Cache) {
	c, T, K := s.c, s.T, int64(s.c.TopK)
	for _, op := range cache.Linears {
		s.add(op, SavedOutput, T*int64(linearOut(c, op)), s.act)
	}
	if cache.Attn {
		s.add(OpAttn, SavedOutput, T*int64(c.Heads*c.VHeadDim()), s.act)
		s.add(OpAttn, SavedLSE, T*int64(c.Heads), F32)
	}
	if cache.TopK {
		s.add(OpRouterTopK, SavedValues, T*K, F32)
		s.add(OpRouterTopK, SavedIndices, T*K, I64)
	}
}

// attention adds the attention half of a block under policy none, after
// its input: the norm's rstd, the q_proj input, the q/k norms' tensors and
// flash attention's q, k, v, output and lse.
func (s *savedList) attention() {
	c, T := s.c, s.T
	if c.IsMLA() {
		s.mlaAttention()
		return
	}
	q, kv := int64(c.Heads*c.HeadDim), int64(c.KVHeads*c.HeadDim)
	s.add(OpAttnNorm, SavedRstd, T, F32)
	s.add(OpQProj, SavedInput, T*int64(c.Hidden), s.act)
	if c.LayerQKNorm(s.layer) {
		rq, rk := T*int64(c.Heads), T*int64(c.KVHeads)
		if c.QKNorm == QKNormFull {
			rq, rk = T, T
		}
		s.add(OpQNorm, SavedInput, T*q, s.act)
		s.add(OpQNorm, SavedRstd, rq, F32)
		s.add(OpKNorm, SavedInput, T*kv, s.act)
		s.add(OpKNorm, SavedRstd, rk, F32)
	}
	s.add(OpAttn, SavedQ, T*q, s.act)
	s.add(OpAttn, SavedK, T*kv, s.act)
	s.add(OpAttn, SavedV, T*kv, s.act)
	s.add(OpAttn, SavedOutput, T*q, s.act)
	s.add(OpAttn, SavedLSE, T*int64(c.Heads), F32)
}

// ffn adds the FFN half of a block under policy none: the norm's tensors,
// then the dense MLP's, or the routed experts' and the shared experts'.
func (s *savedList) ffn() {
	T, D := s.T, int64(s.c.Hidden)
	s.add(OpFFNNorm, SavedInput, T*D, s.act)
	s.add(OpFFNNorm, SavedRstd, T, F32)
	if !s.c.MoELayer[s.layer] {
		s.dense()
		return
	}
	s.routed()
	if s.c.SharedExperts > 0 {
		s.shared()
	}
}

// dense adds the dense MLP's tensors (width DenseFFN).
func (s *savedList) dense() {
	T, Fd := s.T, s.T*int64(s.c.DenseFFN)
	s.add(OpDenseGate, SavedInput, T*int64(s.c.Hidden), s.act)
	s.add(OpDenseAct, SavedGate, Fd, s.act)
	s.add(OpDenseAct, SavedSiLUGate, Fd, s.act)
	s.add(OpDenseAct, SavedUp, Fd, s.act)
	s.add(OpDenseDown, SavedInput, Fd, s.act)
}

// routed adds the router's, the dispatch's, the routed experts' and the
// combine's tensors: T·K token copies, each through an expert of width
// ExpertFFN.
func (s *savedList) routed() {
	c, T := s.c, s.T
	D, E, K := int64(c.Hidden), int64(c.Experts), int64(c.TopK)
	F := T * K * int64(c.ExpertFFN)
	s.add(OpRouter, SavedInput, T*D, s.act)
	s.add(OpRouterTopK, SavedScores, T*E, F32)
	s.add(OpRouterTopK, SavedIndices, T*K, I64)
	if c.NormTopK {
		s.add(OpRouterTopK, SavedValues, T*K, F32)
		s.add(OpRouterTopK, SavedDenominator, T, F32)
	}
	s.add(OpDispatch, SavedOrder, T*K, I64)
	s.add(OpExpertGate, SavedInput, T*K*D, s.act)
	s.add(OpExpertAct, SavedGate, F, s.act)
	s.add(OpExpertAct, SavedSiLUGate, F, s.act)
	s.add(OpExpertAct, SavedUp, F, s.act)
	s.add(OpExpertDown, SavedInput, F, s.act)
	s.add(OpCombine, SavedExpertOutput, T*K*D, s.act)
	s.add(OpCombine, SavedWeights, T*K, F32)
}

// shared adds the shared experts' tensors, and with Qwen2-MoE's gate its
// input and the shared output it scales.
func (s *savedList) shared() {
	c, T := s.c, s.T
	S := T * int64(c.SharedExperts*c.SharedFFN)
	s.add(OpSharedAct, SavedGate, S, s.act)
	s.add(OpSharedAct, SavedSiLUGate, S, s.act)
	s.add(OpSharedAct, SavedUp, S, s.act)
	s.add(OpSharedDown, SavedInput, S, s.act)
	if c.SharedGated {
		s.add(OpSharedScale, SavedGate, T, s.act)
		s.add(OpSharedScale, SavedSharedOutput, T*int64(c.Hidden), s.act)
	}
}
