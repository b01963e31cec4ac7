package memory

import (
	"fmt"

	"github.com/moescope/moescope/moe"
)

// Attention is the attention kernel whose saved tensors are counted.
type Attention string

// Attention kernels.
const (
	// Flash (the default, PyTorch's SDPA flash/cuDNN path) saves q, k, v, the
	// output and the log-sum-exp (fp32, one per query head and token).
	Flash Attention = "flash"
	// Eager materializes the s×s probabilities per head and saves them.
	Eager Attention = "eager"
)

// Shape is what the saved-tensor table depends on besides the model.
type Shape struct {
	Batch     int       // b, sequences in the micro-batch (lbs)
	Seq       int       // s, tokens per sequence
	AC        moe.AC    // checkpointing policy
	Attention Attention // kernel; "" means Flash
	EP        int       // expert-parallel degree; > 1 adds the all-to-all outputs SAC keeps
	Act       moe.DType // activation storage type
}

// Saved returns the tensors layer keeps from forward for backward, one
// record per distinct tensor (a tensor several ops save, such as the
// normalized input of q, k and v, appears once, under the first op that
// needs it). layer is a block index, moe.LayerEmbed or cfg.LayerHead().
//
// Per block (T = b·s tokens, A = activation type, q = H·d, kv = G·d) under
// none, with flash attention:
//
//	attn_norm   input T·D A, rstd T f32
//	q_proj      input (normalized x, shared by k_proj, v_proj) T·D A
//	q_norm      input T·q A, rstd T·H f32 (head) or T f32 (full)
//	k_norm      input T·kv A, rstd T·G f32 (head) or T f32 (full)
//	attention   q T·q, k T·kv, v T·kv, output T·q (all A), lse b·H·s f32
//	ffn_norm    input T·D A, rstd T f32
//	MoE:  router input T·D A; router_topk probabilities T·E f32, indices T·K i64,
//	      top-k weights T·K f32 and their sum T f32 (when renormalized);
//	      dispatch order T·K i64; expert_gate input (dispatched rows) T·K·D A;
//	      expert_act gate, up and silu outputs 3·T·K·F A; expert_down input T·K·F A;
//	      combine expert outputs T·K·D A and weights T·K f32;
//	      shared experts (S = width): act 3·T·S A, down input T·S A; gated:
//	      sigmoid output T A and shared output T·D A
//	dense FFN:  mlp_act 3·T·Fd A, mlp_down input T·Fd A
//
// Eager attention replaces lse by the probabilities b·H·s·s A and adds the
// output T·q A under o_proj. Under full (and the checkpointed blocks of
// layer:N) a block keeps only its input T·D A. Under selective (torchtitan's
// per-op SAC) it keeps its input, the outputs of every other mm/linear
// counted from the first (router gate skipped, grouped GEMMs not counted),
// the attention output and lse, the top-k values and indices, and, with
// ep > 1, the dispatch and combine all-to-all outputs (T·K·D A each).
//
// Embedding: token ids T i64. Head: final_norm input T·D A and rstd T f32,
// lm_head input T·D A, loss log-probabilities T·V f32 and targets T i64
// (chunked loss keeps only the first three; see Options.LossChunks).
func Saved(cfg *moe.Config, layer int, sh Shape) ([]moe.SavedRecord, error) {
	if sh.Batch < 1 || sh.Seq < 1 {
		return nil, fmt.Errorf("batch = %d, seq = %d: both must be ≥ 1", sh.Batch, sh.Seq)
	}
	if sh.Attention == "" {
		sh.Attention = Flash
	}
	if sh.Attention != Flash && sh.Attention != Eager {
		return nil, fmt.Errorf("attention = %q: must be flash or eager", sh.Attention)
	}
	if sh.Act == "" {
		sh.Act = moe.DefaultPrecision.Activation
	}
	T := int64(sh.Batch) * int64(sh.Seq)
	D := int64(cfg.Hidden)
	var out []moe.SavedRecord
	add := func(op moe.Op, tensor string, n int64, t moe.DType) {
		out = append(out, moe.SavedRecord{Layer: layer, Op: op, Tensor: tensor, Elements: n, DType: t})
	}
	switch {
	case layer == moe.LayerEmbed:
		add(moe.OpEmbed, "indices", T, moe.I64)
		return out, nil
	case layer == cfg.LayerHead():
		add(moe.OpFinalNorm, "input", T*D, sh.Act)
		add(moe.OpFinalNorm, "rstd", T, moe.F32)
		add(moe.OpLMHead, "input", T*D, sh.Act)
		add(moe.OpLoss, "log_probs", T*int64(cfg.Vocab), moe.F32)
		add(moe.OpLoss, "targets", T, moe.I64)
		return out, nil
	case layer < 0 || layer >= cfg.Layers:
		return nil, fmt.Errorf("layer = %d: must be in [0, %d], or %d for the embedding", layer, cfg.Layers, moe.LayerEmbed)
	}
	if sh.AC.FullyCheckpointed(layer) {
		add(moe.OpAttnNorm, "input", T*D, sh.Act)
		return out, nil
	}
	if sh.AC.Mode == moe.ACSelective {
		return appendSelective(out, cfg, layer, sh, T), nil
	}
	return appendNone(out, cfg, layer, sh, T), nil
}

// appendNone adds a block's saved tensors without checkpointing.
func appendNone(out []moe.SavedRecord, cfg *moe.Config, layer int, sh Shape, T int64) []moe.SavedRecord {
	A := sh.Act
	D, H, G := int64(cfg.Hidden), int64(cfg.Heads), int64(cfg.KVHeads)
	q, kv := H*int64(cfg.HeadDim), G*int64(cfg.HeadDim)
	add := func(op moe.Op, tensor string, n int64, t moe.DType) {
		out = append(out, moe.SavedRecord{Layer: layer, Op: op, Tensor: tensor, Elements: n, DType: t})
	}
	add(moe.OpAttnNorm, "input", T*D, A)
	add(moe.OpAttnNorm, "rstd", T, moe.F32)
	add(moe.OpQProj, "input", T*D, A)
	switch cfg.QKNorm {
	case moe.QKNormHead:
		add(moe.OpQNorm, "input", T*q, A)
		add(moe.OpQNorm, "rstd", T*H, moe.F32)
		add(moe.OpKNorm, "input", T*kv, A)
		add(moe.OpKNorm, "rstd", T*G, moe.F32)
	case moe.QKNormFull:
		add(moe.OpQNorm, "input", T*q, A)
		add(moe.OpQNorm, "rstd", T, moe.F32)
		add(moe.OpKNorm, "input", T*kv, A)
		add(moe.OpKNorm, "rstd", T, moe.F32)
	}
	add(moe.OpAttn, "q", T*q, A)
	add(moe.OpAttn, "k", T*kv, A)
	add(moe.OpAttn, "v", T*kv, A)
	if sh.Attention == Eager {
		s := int64(sh.Seq)
		add(moe.OpAttn, "probs", int64(sh.Batch)*H*s*s, A)
		add(moe.OpOProj, "input", T*q, A)
	} else {
		add(moe.OpAttn, "output", T*q, A)
		add(moe.OpAttn, "lse", T*H, moe.F32)
	}
	add(moe.OpFFNNorm, "input", T*D, A)
	add(moe.OpFFNNorm, "rstd", T, moe.F32)
	if !cfg.MoELayer[layer] {
		Fd := int64(cfg.DenseFFN)
		add(moe.OpDenseGate, "input", T*D, A)
		add(moe.OpDenseAct, "gate", T*Fd, A)
		add(moe.OpDenseAct, "up", T*Fd, A)
		add(moe.OpDenseAct, "silu", T*Fd, A)
		add(moe.OpDenseDown, "input", T*Fd, A)
		return out
	}
	E, K, F := int64(cfg.Experts), int64(cfg.TopK), int64(cfg.ExpertFFN)
	add(moe.OpRouter, "input", T*D, A)
	add(moe.OpRouterTopK, "probs", T*E, moe.F32)
	add(moe.OpRouterTopK, "indices", T*K, moe.I64)
	if cfg.NormTopK {
		add(moe.OpRouterTopK, "values", T*K, moe.F32)
		add(moe.OpRouterTopK, "sum", T, moe.F32)
	}
	add(moe.OpDispatch, "order", T*K, moe.I64)
	add(moe.OpExpertGate, "input", T*K*D, A)
	add(moe.OpExpertAct, "gate", T*K*F, A)
	add(moe.OpExpertAct, "up", T*K*F, A)
	add(moe.OpExpertAct, "silu", T*K*F, A)
	add(moe.OpExpertDown, "input", T*K*F, A)
	add(moe.OpCombine, "expert_output", T*K*D, A)
	add(moe.OpCombine, "weights", T*K, moe.F32)
	if cfg.SharedExperts > 0 {
		S := int64(cfg.SharedExperts) * int64(cfg.SharedFFN)
		add(moe.OpSharedAct, "gate", T*S, A)
		add(moe.OpSharedAct, "up", T*S, A)
		add(moe.OpSharedAct, "silu", T*S, A)
		add(moe.OpSharedDown, "input", T*S, A)
		if cfg.SharedGated {
			add(moe.OpSharedExpGate, "sigmoid", T, A)
			add(moe.OpSharedExpGate, "shared_output", T*D, A)
		}
	}
	return out
}

// appendSelective adds a block's saved tensors under torchtitan's per-op SAC.
func appendSelective(out []moe.SavedRecord, cfg *moe.Config, layer int, sh Shape, T int64) []moe.SavedRecord {
	A := sh.Act
	D, H := int64(cfg.Hidden), int64(cfg.Heads)
	q, kv := H*int64(cfg.HeadDim), int64(cfg.KVHeads)*int64(cfg.HeadDim)
	add := func(op moe.Op, tensor string, n int64, t moe.DType) {
		out = append(out, moe.SavedRecord{Layer: layer, Op: op, Tensor: tensor, Elements: n, DType: t})
	}
	add(moe.OpAttnNorm, "input", T*D, A)
	// The block's mm/linear calls in order with their output widths; the
	// 1st, 3rd, 5th, ... outputs are saved.
	type mm struct {
		op    moe.Op
		width int64
	}
	mms := []mm{{moe.OpQProj, q}, {moe.OpKProj, kv}, {moe.OpVProj, kv}, {moe.OpOProj, D}}
	switch {
	case !cfg.MoELayer[layer]:
		Fd := int64(cfg.DenseFFN)
		mms = append(mms, mm{moe.OpDenseGate, Fd}, mm{moe.OpDenseUp, Fd}, mm{moe.OpDenseDown, D})
	case cfg.SharedExperts > 0:
		S := int64(cfg.SharedExperts) * int64(cfg.SharedFFN)
		mms = append(mms, mm{moe.OpSharedGate, S}, mm{moe.OpSharedUp, S}, mm{moe.OpSharedDown, D})
		if cfg.SharedGated {
			mms = append(mms, mm{moe.OpSharedExpGate, 1})
		}
	}
	for i, m := range mms {
		if i%2 == 0 {
			add(m.op, "output", T*m.width, A)
		}
		if m.op == moe.OpVProj {
			if sh.Attention == Eager {
				s := int64(sh.Seq)
				add(moe.OpAttn, "probs", int64(sh.Batch)*H*s*s, A)
				add(moe.OpAttn, "output", T*q, A)
			} else {
				add(moe.OpAttn, "output", T*q, A)
				add(moe.OpAttn, "lse", T*H, moe.F32)
			}
		}
		if m.op == moe.OpOProj && cfg.MoELayer[layer] {
			K := int64(cfg.TopK)
			add(moe.OpRouterTopK, "values", T*K, moe.F32)
			add(moe.OpRouterTopK, "indices", T*K, moe.I64)
			if sh.EP > 1 {
				add(moe.OpDispatch, "all_to_all_output", T*K*D, A)
				add(moe.OpCombine, "all_to_all_output", T*K*D, A)
			}
		}
	}
	return out
}

// SavedBytes is the total size of records.
func SavedBytes(records []moe.SavedRecord) int64 {
	var n int64
	for _, r := range records {
		n += r.Bytes()
	}
	return n
}

// largest is the size of the largest record.
func largest(records []moe.SavedRecord) int64 {
	var m int64
	for _, r := range records {
		m = max(m, r.Bytes())
	}
	return m
}
