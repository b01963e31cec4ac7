package ref

import "github.com/moescope/moescope/moe"

// GlobalWeights holds the tensors outside the decoder layers: the token
// embedding [V, D], the final RMSNorm [D] and the LM head [V, D] (the same
// slice as Embed when embeddings are tied). The same type carries gradients.
type GlobalWeights[T Float] struct {
	Embed, FinalNorm, LMHead []T
}

// Embedding looks token ids up in the embedding table and scatters the
// gradient back. It keeps the ids (embedding backward reads them).
type Embedding[T Float] struct {
	cfg *moe.Config
	x   *exec
	ids []int
}

// NewEmbedding returns the embedding runner.
func NewEmbedding[T Float](c *moe.Config, o Options) *Embedding[T] {
	return &Embedding[T]{cfg: c, x: newExec(o)}
}

// Forward returns x [T,D] with x_t = table[ids_t].
func (e *Embedding[T]) Forward(table []T, ids []int) []T {
	D := e.cfg.Hidden
	x := make([]T, len(ids)*D)
	for t, id := range ids {
		copy(x[t*D:t*D+D], table[id*D:id*D+D])
	}
	e.ids = ids
	e.x.op(moe.LayerEmbed, moe.OpEmbed, moe.Forward, int64(len(ids))*int64(D))
	e.x.saved(moe.LayerEmbed, moe.OpEmbed, moe.SavedIDs, len(ids), moe.I64)
	return x
}

// Backward accumulates gTable[ids_t] += dx_t.
func (e *Embedding[T]) Backward(gTable, dx []T) {
	D := e.cfg.Hidden
	for t, id := range e.ids {
		ge := gTable[id*D : id*D+D]
		for j, v := range dx[t*D : t*D+D] {
			ge[j] += v
		}
	}
	e.x.op(moe.LayerEmbed, moe.OpEmbed, moe.BackwardWeight, int64(len(e.ids))*int64(D))
	e.ids = nil
}

// Head runs final RMSNorm, LM head and cross-entropy (loss.go) on the last
// block's output, keeping what its backward reads.
type Head[T Float] struct {
	cfg          *moe.Config
	x            *exec
	in, hf, rstd []T // final norm input, output [T,D] and rstd [T]
	logp         []T // log-probabilities [T,V]
	labels       []int
}

// NewHead returns the head runner.
func NewHead[T Float](c *moe.Config, o Options) *Head[T] {
	return &Head[T]{cfg: c, x: newExec(o)}
}

// Forward returns the mean cross-entropy of x [T,D] against labels [T].
func (h *Head[T]) Forward(w *GlobalWeights[T], x []T, labels []int) float64 {
	c, ex, L := h.cfg, h.x, h.cfg.LayerHead()
	T_, D, V := len(labels), c.Hidden, c.Vocab
	t64 := int64(T_)
	h.in, h.labels = x, labels
	h.hf, h.rstd = make([]T, T_*D), make([]T, T_)
	rmsNormFwd(h.hf, h.rstd, x, w.FinalNorm, D, c.NormEps)
	ex.round(h.hf)
	ex.op(L, moe.OpFinalNorm, moe.Forward, t64*int64(D))
	h.logp = make([]T, T_*V)
	linear(ex, L, moe.OpLMHead, moe.Forward, h.logp, h.hf, w.LMHead, nil, T_, V, D)
	loss := crossEntropyFwd(h.logp, labels, V)
	ex.op(L, moe.OpLoss, moe.Forward, t64*int64(V))
	ex.saved(L, moe.OpFinalNorm, moe.SavedInput, len(x), ex.act)
	ex.saved(L, moe.OpFinalNorm, moe.SavedRstd, len(h.rstd), moe.F32)
	ex.saved(L, moe.OpLMHead, moe.SavedInput, len(h.hf), ex.act)
	ex.saved(L, moe.OpLoss, moe.SavedLogProbs, len(h.logp), moe.F32)
	ex.saved(L, moe.OpLoss, moe.SavedLabels, T_, moe.I64)
	return loss
}

// DeferWeightGrads makes the head's backwards queue the LM head's
// weight-gradient GEMM on q (WeightQueue) until it is called with nil.
func (h *Head[T]) DeferWeightGrads(q *WeightQueue) { h.x.wq = q }

// Backward accumulates the gradients of scale·loss into g and returns the
// gradient of the head's input.
func (h *Head[T]) Backward(w, g *GlobalWeights[T], scale float64) []T {
	c, ex, L := h.cfg, h.x, h.cfg.LayerHead()
	T_, D, V := len(h.labels), c.Hidden, c.Vocab
	t64 := int64(T_)
	dlogits := make([]T, T_*V)
	crossEntropyBwd(dlogits, h.logp, h.labels, V, scale)
	ex.op(L, moe.OpLoss, moe.BackwardData, t64*int64(V))
	dhf := make([]T, T_*D)
	linearBack(ex, L, moe.OpLMHead, dhf, g.LMHead, nil, dlogits, h.hf, w.LMHead, T_, V, D)
	dx := make([]T, T_*D)
	rmsNormBwd(dx, g.FinalNorm, dhf, h.in, h.rstd, w.FinalNorm, D)
	ex.op(L, moe.OpFinalNorm, moe.BackwardData, t64*int64(D))
	ex.op(L, moe.OpFinalNorm, moe.BackwardWeight, t64*int64(D))
	*h = Head[T]{cfg: h.cfg, x: h.x}
	return dx
}
