package flops

import (
	"fmt"
	"slices"

	"github.com/moescope/moescope/moe"
)

// MaxLayers bounds the layer count of per-op tables (each layer holds a few
// dozen records).
const MaxLayers = 1 << 16

// Ops returns the analytic op table of one training step (forward,
// backward and the recompute the checkpointing policy and flash attention
// cause) of s.Batch sequences of s.Seq tokens, following the counting rules
// of moe/ops.go exactly. There is one record per (Layer, Op, Pass), in
// forward call order: embed (moe.LayerEmbed); for each block attn_norm,
// q_proj, k_proj, v_proj, q_norm, k_norm (under MLA instead q_proj or
// q_a_proj, q_a_norm, q_b_proj, then kv_a_proj, kv_a_norm, kv_b_proj),
// rope, attention, o_proj,
// residual, ffn_norm, then either router, router_topk, dispatch,
// expert_gate, expert_up, expert_act, expert_down, combine,
// shared_gate_proj, shared_up_proj, shared_act, shared_down_proj,
// shared_expert_gate, shared_scale and aux_loss (MoE layers) or
// mlp_gate_proj, mlp_up_proj, mlp_act, mlp_down_proj (dense layers); then
// final_norm, lm_head and loss (cfg.LayerHead()). Within an op the passes
// come in the order forward, backward_data, backward_weight, recompute.
//
// Attention scores per head and sequence are AttentionEntries(s, window,
// tile), or ChunkedEntries(s, chunk, tile) on Llama 4's chunked layers:
// tile = ExactTile gives the model count, a GPU tile adds its waste.
//
// Recompute records, choices the counting rules leave open made explicit:
//   - attention always has one of n·d per head and sequence: flash
//     attention's backward recomputes QKᵀ whatever the policy. When the
//     block is also recomputed whole, its forward 2·n·d adds to the same
//     record (one record per key).
//   - ac "full", and "layer:N" on blocks i with (i+1) mod N = 0: every op of
//     the block repeats its forward count. aux_loss is computed after the
//     blocks from the router scores the block returns (HF's
//     load_balancing_loss_func), so it is never recomputed; embed,
//     final_norm, lm_head and loss are outside blocks and never recomputed.
//   - "selective" (torchtitan's per-op SAC): the block's mm/linear calls are
//     counted in forward call order (q, k, v, o, or MLA's q or q_a, q_b,
//     kv_a, kv_b, o; then the shared experts'
//     gate, up, down and Qwen2-MoE's shared_expert_gate, or the dense FFN's
//     gate, up, down); the 1st, 3rd, … are saved and the 2nd, 4th, … are
//     recomputed. The router-gate mm is never saved and not counted; the
//     grouped expert GEMMs and every elementwise op of the block
//     (router_topk and the index ops included) are recomputed; attention is
//     saved. The count restarts at each block.
//   - "modules:M,…" (Megatron-Core's recompute modules, moe.RecomputeModules):
//     layernorm repeats ffn_norm's forward count in MoE blocks and
//     attn_norm's in MLA blocks, moe_act expert_act's in MoE blocks, moe
//     every op of the MoE layer's forward in MoE blocks (moe.InMoELayer:
//     router, router_topk, dispatch, the expert GEMMs and activation,
//     combine, the shared experts; with moe_act too, expert_act twice).
//   - "none", and blocks layer:N leaves alone: no recompute but flash's.
//
// aux_loss records appear when the loss is computed: cfg.OutputRouterLogits
// and cfg.AuxLossCoef > 0 (HF's rule; a caller that always adds it sets
// OutputRouterLogits on a copy). shared_scale (the σ(x·w_g) scaling of
// gated shared experts) is the elementwise op moe.OpSharedScale.
func Ops(cfg *moe.Config, s Shape, ac moe.AC, tile Tile) ([]moe.OpRecord, error) {
	if err := checkInputs(cfg, s, tile); err != nil {
		return nil, err
	}
	if err := checkAC(ac); err != nil {
		return nil, err
	}
	b := &opBuilder{cfg: cfg, s: s, tile: tile, T: s.Tokens(), nAttn: map[[2]int]int64{}}
	b.emit(moe.LayerEmbed, moe.OpEmbed, b.mul(b.T, int64(cfg.Hidden)), false, 0)
	for l := 0; l < cfg.Layers; l++ {
		b.block(l, ac)
	}
	D, V := int64(cfg.Hidden), int64(cfg.Vocab)
	h := cfg.LayerHead()
	b.emit(h, moe.OpFinalNorm, b.mul(b.T, D), false, 0)
	b.emit(h, moe.OpLMHead, b.mul(b.T, V, D), false, 0)
	b.emit(h, moe.OpLoss, b.mul(b.T, V), false, 0)
	if b.err != nil {
		return nil, b.err
	}
	return b.recs, nil
}

func checkInputs(cfg *moe.Config, s Shape, tile Tile) error {
	if cfg == nil {
		return fmt.Errorf("flops: nil config")
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid config: %w", err)
	}
	if cfg.Layers > MaxLayers {
		return fmt.Errorf("layers = %d: per-op tables support at most %d", cfg.Layers, MaxLayers)
	}
	if err := s.Validate(); err != nil {
		return err
	}
	return tile.Validate()
}

func checkAC(ac moe.AC) error {
	_, err := moe.ParseAC(ac.String())
	return err
}

type opBuilder struct {
	checked
	cfg   *moe.Config
	s     Shape
	tile  Tile
	T     int64
	recs  []moe.OpRecord
	nAttn map[[2]int]int64 // attention entries by window and chunk, cached
}

// emit appends the records of one op: forward count fwd, and recompute of
// fwd when rec, plus extra recompute (flash attention's own).
func (b *opBuilder) emit(layer int, op moe.Op, fwd int64, rec bool, extra int64) {
	bd, bw := b.backward(op, fwd)
	b.add4(layer, op, fwd, bd, bw, rec, extra)
}

func (b *opBuilder) add4(layer int, op moe.Op, fwd, bd, bw int64, rec bool, extra int64) {
	if b.err != nil {
		return
	}
	b.recs = append(b.recs, moe.OpRecord{Layer: layer, Op: op, Pass: moe.Forward, Count: fwd})
	if bd > 0 {
		b.recs = append(b.recs, moe.OpRecord{Layer: layer, Op: op, Pass: moe.BackwardData, Count: bd})
	}
	if bw > 0 {
		b.recs = append(b.recs, moe.OpRecord{Layer: layer, Op: op, Pass: moe.BackwardWeight, Count: bw})
	}
	r := extra
	if rec {
		r = b.add(r, fwd)
	}
	if r > 0 {
		b.recs = append(b.recs, moe.OpRecord{Layer: layer, Op: op, Pass: moe.Recompute, Count: r})
	}
}

// backward gives the backward_data and backward_weight counts of an op with
// forward count fwd, as moe/ops.go's table fixes them.
func (b *opBuilder) backward(op moe.Op, fwd int64) (bd, bw int64) {
	switch op.Kind() {
	case moe.KindMatmul, moe.KindGrouped:
		return fwd, fwd
	}
	switch op {
	case moe.OpEmbed:
		return 0, fwd
	case moe.OpQNorm, moe.OpKNorm:
		if b.cfg.QKNorm == moe.QKNormL2Rope {
			return fwd, 0 // Llama 4's L2 norm has no weight
		}
		return fwd, fwd
	case moe.OpAttnNorm, moe.OpFFNNorm, moe.OpFinalNorm, moe.OpQANorm, moe.OpKVANorm:
		return fwd, fwd
	case moe.OpResidual:
		return 0, 0
	}
	return fwd, 0 // rope, router_topk, dispatch, activations, combine, shared_scale, loss, aux_loss
}

// attnEntries caches AttentionEntries per window and ChunkedEntries per
// chunk (a layer has one or the other, moe.Config.Validate).
func (b *opBuilder) attnEntries(w, chunk int) int64 {
	key := [2]int{w, chunk}
	if n, ok := b.nAttn[key]; ok {
		return n
	}
	n := AttentionEntries(b.s.Seq, w, b.tile)
	if chunk > 0 {
		n = ChunkedEntries(b.s.Seq, chunk, b.tile)
	}
	b.nAttn[key] = n
	return n
}

// block emits the records of decoder layer l under policy ac.
func (b *opBuilder) block(l int, ac moe.AC) {
	c := b.cfg
	T, D := b.T, int64(c.Hidden)
	H, G, d := int64(c.Heads), int64(c.KVHeads), int64(c.HeadDim)
	q, kv := H*d, G*d
	full := ac.FullyCheckpointed(l)
	// A caching policy (selective, memory budget) recomputes every op of
	// the block but the cached linears and attention.
	cache, selective := ac.Cached(c, l, b.s.Seq, b.s.act())
	moeLayer := ac.MoERecomputed(c, l)
	// linear: an mm/linear the caching policies may keep.
	linear := func(op moe.Op, fwd int64) {
		b.emit(l, op, fwd, full || (selective && !slices.Contains(cache.Linears, op)) || (moeLayer && moe.InMoELayer(op)), 0)
	}
	// other: router mm, grouped GEMMs and elementwise ops, all recomputed
	// under a caching policy.
	other := func(op moe.Op, fwd int64) {
		act := op == moe.OpExpertAct && ac.ActRecomputed(c, l)
		var extra int64
		if act && moeLayer {
			extra = fwd // moe_act's own recompute inside the MoE layer's
		}
		module := ac.NormRecomputed(c, l, op) || act || (moeLayer && moe.InMoELayer(op))
		b.emit(l, op, fwd, full || selective || module, extra)
	}

	other(moe.OpAttnNorm, b.mul(T, D))
	if c.IsMLA() {
		b.mlaProjections(linear, other)
	} else {
		linear(moe.OpQProj, b.mul(T, q, D))
		linear(moe.OpKProj, b.mul(T, kv, D))
		linear(moe.OpVProj, b.mul(T, kv, D))
		if c.LayerQKNorm(l) {
			other(moe.OpQNorm, b.mul(T, q))
			other(moe.OpKNorm, b.mul(T, kv))
		}
	}
	if c.Roped(l) { // Llama 4's NoPE layers rotate nothing
		other(moe.OpRoPE, b.mul(T, H+int64(c.KVRotaryHeads()), int64(c.RotaryDim())))
	}
	// Attention: per head and sequence n·(d_qk+d_v) forward (QKᵀ, PV),
	// 2·n·(d_qk+d_v) backward_data, n·d_qk recompute (flash's QKᵀ), for
	// Batch sequences and H query heads; d_qk = d_v = d outside MLA.
	n := b.attnEntries(c.Window[l], c.LayerChunk(l))
	dv := int64(c.VHeadDim())
	nh := b.mul(int64(b.s.Batch), H, n)
	fwd := b.mul(nh, d+dv)
	b.add4(l, moe.OpAttn, fwd, b.mul(2, fwd), 0, full || selective && !cache.Attn, b.mul(nh, d))
	linear(moe.OpOProj, b.mul(T, D, H*dv))
	other(moe.OpResidual, b.mul(2, T, D))
	other(moe.OpFFNNorm, b.mul(T, D))
	if !c.MoELayer[l] {
		Fd := int64(c.DenseFFN)
		linear(moe.OpDenseGate, b.mul(T, Fd, D))
		linear(moe.OpDenseUp, b.mul(T, Fd, D))
		other(moe.OpDenseAct, b.mul(T, Fd))
		linear(moe.OpDenseDown, b.mul(T, D, Fd))
		return
	}
	E, K, F := int64(c.Experts), int64(c.TopK), int64(c.ExpertFFN)
	TK := b.mul(T, K)
	other(moe.OpRouter, b.mul(T, E, D))
	other(moe.OpRouterTopK, b.mul(T, E))
	other(moe.OpDispatch, b.mul(TK, D))
	other(moe.OpExpertGate, b.mul(TK, F, D))
	other(moe.OpExpertUp, b.mul(TK, F, D))
	other(moe.OpExpertAct, b.mul(TK, F))
	other(moe.OpExpertDown, b.mul(TK, D, F))
	other(moe.OpCombine, b.mul(TK, D))
	if c.SharedExperts > 0 {
		S := b.mul(int64(c.SharedExperts), int64(c.SharedFFN))
		linear(moe.OpSharedGate, b.mul(T, S, D))
		linear(moe.OpSharedUp, b.mul(T, S, D))
		other(moe.OpSharedAct, b.mul(T, S))
		linear(moe.OpSharedDown, b.mul(T, D, S))
		if c.SharedGated {
			linear(moe.OpSharedExpGate, b.mul(T, 1, D))
			other(moe.OpSharedScale, b.mul(T, D))
		}
	}
	if c.OutputRouterLogits && c.AuxLossCoef > 0 {
		b.emit(l, moe.OpAuxLoss, b.mul(T, E), false, 0)
	}
}

// mlaProjections emits an MLA block's query and key-value projections and
// latent norms in forward order (mla.go's counting rules: a linear of M = T
// rows counts T·N·K; a norm T·width).
func (b *opBuilder) mlaProjections(linear, other func(moe.Op, int64)) {
	c, T, D := b.cfg, b.T, int64(b.cfg.Hidden)
	m, H := c.MLA, int64(c.Heads)
	qk := b.mul(H, int64(c.HeadDim))
	if m.QRank == 0 {
		linear(moe.OpQProj, b.mul(T, qk, D))
	} else {
		Rq := int64(m.QRank)
		linear(moe.OpQAProj, b.mul(T, Rq, D))
		other(moe.OpQANorm, b.mul(T, Rq))
		linear(moe.OpQBProj, b.mul(T, qk, Rq))
	}
	Rkv := int64(m.KVRank)
	linear(moe.OpKVAProj, b.mul(T, Rkv+int64(m.Rope), D))
	other(moe.OpKVANorm, b.mul(T, Rkv))
	linear(moe.OpKVBProj, b.mul(T, b.mul(H, int64(m.Nope+m.V)), Rkv))
}
