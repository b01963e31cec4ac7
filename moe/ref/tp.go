package ref

import "github.com/moescope/moescope/moe"

// Tensor parallelism with sequence parallelism, as torchtitan v0.2.2 applies
// it (73a0e69: models/qwen3/infra/parallelize.py apply_non_moe_tp,
// models/llama4/infra/parallelize.py apply_moe_ep_tp): between the block's
// norms (the sequence-parallel region, T/tp tokens per tp rank) and its
// column-parallel linears (q/k/v, w1/w3, the MoE module) an all-gather
// brings back all T tokens; the row-parallel linears (o, w2, the MoE
// output) leave partial sums over [T, D] that a reduce-scatter sums and
// splits back into the sequence-parallel region. Between the two, a tp rank
// runs the block on its 1/tp of the heads and FFN widths: TPLocal's config.

// TPComm moves one tensor-parallel rank's activations in and out of the
// sequence-parallel region. pass is the pass that needs it: Forward or
// Recompute for the forward's collectives, BackwardData for their adjoints
// (the gradient of an all-gather is a reduce-scatter and vice versa). The
// slices Gather and Scatter are given are the block's step buffers, reused
// by its next step (model_block_scratch.go): a comm must not keep them
// past the call.
type TPComm[T Float] interface {
	// Gather returns all T tokens [T, D] of the group from this rank's
	// local tokens [T/tp, D] (all-gather).
	Gather(layer int, pass moe.Pass, local []T) []T
	// Scatter sums the members' partial [T, D] and returns this rank's
	// local tokens of the sum [T/tp, D] (reduce-scatter).
	Scatter(layer int, pass moe.Pass, partial []T) []T
	// AllReduce replaces v on every member by the elementwise sum over the
	// group, or the maximum when max is set (loss parallel's reductions).
	AllReduce(layer int, v []T, max bool)
	// ExpertTokens is the range [lo, hi) of the group's tokens (flattened
	// batch·seq order) whose routed rows this rank dispatches to the
	// experts: all of them, or 1/tp when expert parallelism borrows the
	// tp ranks (etp = 1: torchtitan v0.2.2 expert_parallel.py
	// ReordererSequenceParallel splits the routed tokens along their
	// first dimension by tp rank).
	ExpertTokens(tokens int) (lo, hi int)
	// ExpertsDone is called in a MoE block's backward once its routed
	// experts' weight gradients are complete, before the reduce-scatter of
	// the MoE input's gradient: where the schedule reduces them.
	ExpertsDone(layer int)
}

// TPLocal returns the config one tensor-parallel rank runs its share of a
// layer of c with: heads and KV heads divided by tp, the dense and the (fused)
// shared FFN widths by tp, the routed experts' width by expertTP and the
// vocabulary by tp, rounded up (torch's Shard(0) of an uneven dimension
// pads the last chunk). job.Layout.CheckModel guarantees the other divisions.
// The config describes local shapes, not a model of its own.
func TPLocal(c *moe.Config, tp, expertTP int) *moe.Config {
	l := *c
	l.Heads, l.KVHeads, l.DenseFFN = c.Heads/tp, c.KVHeads/tp, c.DenseFFN/tp
	if c.SharedExperts > 0 {
		l.SharedExperts, l.SharedFFN = 1, c.SharedExperts*c.SharedFFN/tp
	}
	l.ExpertFFN = c.ExpertFFN / expertTP
	l.Vocab = (c.Vocab + tp - 1) / tp
	return &l
}

// tpRegion is the part [r0, r1) × [c0, c1) of p (as a [rows, cols] matrix)
// that member idx of a split of degree n holds; pad is the number of rows it
// holds past the end of an uneven dim-0 split.
func tpRegion(p moe.Param, n, idx int) (rows, cols, r0, r1, c0, c1 int) {
	rows = p.Shape[0]
	cols = 1
	for _, d := range p.Shape[1:] {
		cols *= d
	}
	r0, r1, c0, c1 = 0, rows, 0, cols
	switch p.TP {
	case moe.TPDim0:
		ch := (rows + n - 1) / n
		r0, r1 = min(idx*ch, rows), min((idx+1)*ch, rows)
	case moe.TPDim1:
		ch := cols / n
		c0, c1 = idx*ch, (idx+1)*ch
	}
	return
}

// TPShard returns member idx's piece of tensor p (whole in full) under a
// tensor-parallel split of degree n along p.TP: rows for TPDim0 (padded
// with zero rows to ⌈rows/n⌉ where the split is uneven), columns for
// TPDim1, a copy of everything for TPReplicated.
func TPShard[T Float](p moe.Param, full []T, n, idx int) []T {
	if p.TP == moe.TPReplicated || n == 1 {
		return append([]T(nil), full...)
	}
	rows, cols, r0, r1, c0, c1 := tpRegion(p, n, idx)
	if p.TP == moe.TPDim0 {
		out := make([]T, (rows+n-1)/n*cols)
		copy(out, full[r0*cols:r1*cols])
		return out
	}
	w := c1 - c0
	out := make([]T, rows*w)
	for r := 0; r < rows; r++ {
		copy(out[r*w:(r+1)*w], full[r*cols+c0:r*cols+c1])
	}
	return out
}

// TPUnshard writes member idx's piece (as TPShard returns it) into its
// place in full, adding when add is set. A replicated tensor is written by
// member 0 only (every member holds the same).
func TPUnshard[T Float](p moe.Param, piece, full []T, n, idx int, add bool) {
	put := func(dst, src []T) {
		if !add {
			copy(dst, src)
			return
		}
		for i, v := range src {
			dst[i] += v
		}
	}
	if p.TP == moe.TPReplicated || n == 1 {
		if idx == 0 || n == 1 {
			put(full, piece)
		}
		return
	}
	rows, cols, r0, r1, c0, c1 := tpRegion(p, n, idx)
	if p.TP == moe.TPDim0 {
		put(full[r0*cols:r1*cols], piece[:(r1-r0)*cols])
		return
	}
	w := c1 - c0
	for r := 0; r < rows; r++ {
		put(full[r*cols+c0:r*cols+c1], piece[r*w:(r+1)*w])
	}
}
