package memory

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
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
	Compile   Compile   // what torch.compile compiles; zero value: eager
	// LossDType is the type the eager cross-entropy computes and saves its
	// log-probabilities in: F32 ("" too) for torchtitan's pred.float(), or
	// the activation type for a loss that does not upcast.
	LossDType moe.DType
	// TP is the tensor-parallel degree (0 or 1: none); ExpertTP and
	// ExpertRows are the layout's ExpertTP and TokensPerExpertRank (0 = 1).
	// Batch·Seq stays the data-parallel rank's tokens, which the tp ranks
	// of one group share.
	TP, ExpertTP, ExpertRows int
	// TE: TransformerEngine blocks and loss (te.go); zero value: none.
	TE TE
	// AutoModel: NeMo AutoModel's blocks (automodel.go); zero value: none.
	AutoModel AutoModel
	// CP is the context-parallel degree Seq is a shard of (0 or 1: none)
	// and CPMethod its K/V exchange: attention's exchange buffers
	// (cpBuffers); the saved tensors are the shard's.
	CP       int
	CPMethod job.CPMethod
	// ExpertLoad is the rows the most loaded expert-parallel rank's experts
	// receive ÷ the mean (job.Recipe's ExpertSkew; 0 or 1: balanced): the
	// table is that rank's (loadedRank), the one whose memory decides
	// whether a step fits.
	ExpertLoad float64
}

// Saved returns the tensors layer keeps from forward for backward, one
// record per distinct tensor. layer is a block index, moe.LayerEmbed or
// cfg.LayerHead().
//
// With flash attention and ep = 1 it is exactly moe.SavedTensors, the table
// the reference implementation follows and records (see package moe's
// saved.go for the op × policy table). Two things the reference does not
// execute are added here:
//   - eager attention: the probabilities b·H·s·s (activation type) replace
//     the log-sum-exp under none; under selective nothing of the attention
//     is kept (its bmm/softmax are not in torchtitan's SAC save list, so
//     output and probabilities are recomputed);
//   - expert parallelism: under selective, SAC keeps the dispatch and
//     combine all-to-all outputs (T·K·D each, activation type) of MoE blocks;
//   - TransformerEngine (sh.TE): Megatron-Core's TE blocks keep the table
//     teBlock gives, TE's cross-entropy its logits alone (teLoss);
//   - torch.compile (sh.Compile): a compiled block keeps the eager table
//     minus the fused intermediates compiledBlock names, a compiled loss
//     its logits and log-sum-exp instead of the log-probabilities
//     (compiledLoss); an eager loss that does not upcast keeps its
//     log-probabilities in sh.LossDType;
//   - tensor parallelism (sh.TP > 1): each tensor as one tp rank holds it,
//     split in the sequence-parallel regions and whole in the tensor-parallel
//     ones (tpSaved).
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
	if layer != moe.LayerEmbed && (layer < 0 || layer > cfg.Layers) {
		return nil, fmt.Errorf("layer = %d: must be in [0, %d], or %d for the embedding", layer, cfg.Layers, moe.LayerEmbed)
	}
	p := moe.DefaultPrecision
	p.Activation = sh.Act
	if sh.LossDType == "" {
		sh.LossDType = moe.F32
	}
	switch sh.LossDType {
	case moe.F32, moe.BF16, moe.F16:
	default:
		return nil, fmt.Errorf("loss dtype = %q: must be f32, bf16 or f16", sh.LossDType)
	}
	rs := moe.SavedTensors(cfg, layer, sh.Batch, sh.Seq, sh.AC, p)
	T := int64(sh.Batch) * int64(sh.Seq)
	if layer == cfg.LayerHead() {
		return tpSaved(cfg, layer, sh, headSaved(rs, T, sh)), nil
	}
	if layer < 0 || sh.AC.FullyCheckpointed(layer) {
		return tpSaved(cfg, layer, sh, rs), nil
	}
	selective := sh.AC.Mode == moe.ACSelective
	if sh.Attention == Eager && sh.AC.Mode == moe.ACMemoryBudget {
		return nil, fmt.Errorf("attention = eager with ac = %s: not modelled (the memory budget's knapsack weighs flash attention's output and log-sum-exp)", sh.AC)
	}
	if sh.Attention == Eager {
		out := rs[:0:0]
		for _, r := range rs {
			if r.Op == moe.OpAttn && (r.Tensor == moe.SavedLSE || (selective && r.Tensor == moe.SavedOutput)) {
				continue
			}
			out = append(out, r)
		}
		if !selective {
			s := int64(sh.Seq)
			out = append(out, moe.SavedRecord{Layer: layer, Op: moe.OpAttn, Tensor: moe.SavedProbs,
				Elements: int64(sh.Batch) * int64(cfg.Heads) * s * s, DType: sh.Act})
		}
		rs = out
	}
	if selective && sh.EP > 1 && cfg.MoELayer[layer] {
		n := T * int64(cfg.TopK) * int64(cfg.Hidden)
		rs = append(rs,
			moe.SavedRecord{Layer: layer, Op: moe.OpDispatch, Tensor: moe.SavedAllToAllOutput, Elements: n, DType: sh.Act},
			moe.SavedRecord{Layer: layer, Op: moe.OpCombine, Tensor: moe.SavedAllToAllOutput, Elements: n, DType: sh.Act})
	}
	if sh.Compile.Model {
		rs = compiledBlock(cfg, layer, sh.AC, rs)
	}
	if sh.TE.Blocks {
		rs = teBlock(cfg, layer, sh.AC, sh.TE, rs)
	}
	rs = autoModelBlock(cfg, layer, sh, rs)
	return loadedRank(sh, tpSaved(cfg, layer, sh, rs)), nil
}

// loadedRank scales the tensors of the rows a rank's experts receive by
// sh.ExpertLoad under expert parallelism: the dispatch's all-to-all
// output and every routed expert's saved tensor (rounded up). The rank's
// own tokens' tensors (the router's, the dispatch order, the combine's
// returned outputs and weights) stay: each rank routes its own tokens.
func loadedRank(sh Shape, rs []moe.SavedRecord) []moe.SavedRecord {
	if sh.EP <= 1 || sh.ExpertLoad <= 1 {
		return rs
	}
	for i, r := range rs {
		switch {
		case r.Op == moe.OpExpertGate, r.Op == moe.OpExpertUp, r.Op == moe.OpExpertAct, r.Op == moe.OpExpertDown,
			r.Op == moe.OpDispatch && r.Tensor == moe.SavedAllToAllOutput:
			rs[i].Elements = int64(math.Ceil(float64(r.Elements) * sh.ExpertLoad))
		}
	}
	return rs
}

// headSaved is the head's table under sh: the loss's log-probabilities in
// the loss type, or a compiled loss's tensors.
func headSaved(rs []moe.SavedRecord, tokens int64, sh Shape) []moe.SavedRecord {
	if sh.TE.Loss {
		return teLoss(rs, sh.Act)
	}
	if sh.Compile.Loss {
		return compiledLoss(rs, tokens, sh.Act)
	}
	for i, r := range rs {
		if r.Op == moe.OpLoss && r.Tensor == moe.SavedLogProbs {
			rs[i].DType = sh.LossDType
		}
	}
	return rs
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
