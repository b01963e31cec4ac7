package numeric

import (
	"context"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// Tensor parallelism with sequence parallelism (torchtitan v0.2.2,
// 73a0e69: models/qwen3/infra/parallelize.py apply_non_moe_tp,
// models/llama4/infra/parallelize.py apply_moe_ep_tp). The tp ranks of one
// group read the same sequences; each holds its pieces of the weights
// (ref.TPShard: column-wise q/k/v, w1/w3 and the LM head, row-wise o and
// w2, the embedding's vocabulary rows; the norms, the router gate and the
// shared-expert gate whole) and runs its blocks with ref.TPLocal's
// heads and widths. Sequence-parallel tensors hold, of every sequence of
// the micro-batch, the positions [j·S/tp, (j+1)·S/tp) on member j (torch's
// Shard(1) of [batch, seq, hidden]). The collectives are
// parallel.TPCollectives' (TestTPCollectivesAreTheListed checks it), and
// the schedule's all-reduce over tp per unit and micro-step of the
// replicated tensors' gradients (parallel.TPReplicatedElements): each member
// computed them from its own tokens or heads (DTensor's Partial placement
// of a Replicate parameter's gradient, reduced to Replicate).

// tpComm is one rank's ref.TPComm on its tensor-parallel group.
type tpComm struct {
	ctx   context.Context
	ep    *collective.Endpoint
	group parallel.Group
	idx   int // this rank's member index (its sequence-parallel positions)

	batch, seq, hidden int
	vocabLo            int // the first vocabulary row of this rank's embedding and LM head pieces
	act                moe.DType
	ac                 moe.AC
	splitRows          bool // ep > 1 at etp = 1: Layout.TokensPerExpertRank() = tp
	// expertsDone reduces a layer's expert gradients in the current
	// micro-step (nil under expert parallelism: the EP stage does it
	// between its two all-to-alls).
	expertsDone func(layer int) error
	err         error
	// log, when non-nil, receives per layer every tensor-parallel
	// collective issued, as parallel.TPColl describes it (tests).
	log map[int][]parallel.TPColl
}

// newTPComm returns the communicator of rank on its tp group g (a
// group of the mesh of layout l, a stage's under pipeline parallelism)
// for micro-batches of batch b: its member index is its tp index, since
// the group lists its ranks in increasing order (parallel.Group).
func newTPComm(g parallel.Group, rank int, b parallel.Batch, cfg *moe.Config, l job.Layout, p moe.Precision, ac moe.AC) *tpComm {
	idx := g.IndexOf(rank)
	return &tpComm{group: g, idx: idx, batch: b.LBS, seq: b.Seq, hidden: cfg.Hidden, vocabLo: vocabLo(cfg.Vocab, g.Size(), idx),
		act: p.Activation, ac: ac, splitRows: l.TokensPerExpertRank() > 1}
}

// vocabLo is the first vocabulary row held by member idx of tp members
// that split vocab rows as ref.TPShard does (⌈vocab/tp⌉ each, the last
// padded with zero rows).
func vocabLo(vocab, tp, idx int) int { return idx * ((vocab + tp - 1) / tp) }

func (c *tpComm) bind(ctx context.Context, ep *collective.Endpoint) {
	c.ctx, c.ep, c.err = ctx, ep, nil
}

func (c *tpComm) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// record logs a collective of layer as the phase and purpose
// TPCollectives names it by: a recompute's collectives are the
// PhaseRecompute ones of a fully checkpointed block; under the selective
// policy only the all-gathers re-run, listed as backward re-gathers.
func (c *tpComm) record(layer int, pass moe.Pass, k parallel.CollKind, dt moe.DType, n int) {
	if c.log == nil {
		return
	}
	e := parallel.TPColl{Coll: k, DType: dt, Elements: int64(n)}
	gather := k == parallel.CollAllGather
	switch {
	case k == parallel.CollAllReduce:
		e.Phase, e.Purpose = parallel.PhaseForward, parallel.PurposeTPLoss
	case pass == moe.Forward:
		e.Phase, e.Purpose = parallel.PhaseForward, pick(gather, parallel.PurposeTPGather, parallel.PurposeTPReduce)
	case pass == moe.Recompute && c.ac.FullyCheckpointed(layer):
		e.Phase, e.Purpose = parallel.PhaseRecompute, pick(gather, parallel.PurposeTPGather, parallel.PurposeTPReduce)
	case pass == moe.Recompute:
		e.Phase, e.Purpose = parallel.PhaseBackward, parallel.PurposeTPRegather
	default:
		e.Phase, e.Purpose = parallel.PhaseBackward, pick(gather, parallel.PurposeTPGradGath, parallel.PurposeTPGradRed)
	}
	c.log[layer] = append(c.log[layer], e)
}

func pick(cond bool, a, b parallel.Purpose) parallel.Purpose {
	if cond {
		return a
	}
	return b
}

// Gather implements ref.TPComm: the all-gather of the members' positions,
// reordered from [member][batch][seq/tp] to [batch][seq].
func (c *tpComm) Gather(layer int, pass moe.Pass, local []float32) []float32 {
	n, D, B := c.group.Size(), c.hidden, c.batch
	sl := c.seq / n
	out := make([]float32, len(local)*n)
	c.record(layer, pass, parallel.CollAllGather, c.act, len(out))
	if c.err != nil {
		return out
	}
	g, err := c.ep.AllGather(c.ctx, c.group, c.act, local)
	if err != nil {
		c.fail(err)
		return out
	}
	for m := 0; m < n; m++ {
		for b := 0; b < B; b++ {
			src := g[((m*B+b)*sl)*D : ((m*B+b)*sl+sl)*D]
			copy(out[(b*c.seq+m*sl)*D:], src)
		}
	}
	return out
}

// Scatter implements ref.TPComm: partial [batch][seq] laid out as
// [member][batch][seq/tp] and reduce-scattered.
func (c *tpComm) Scatter(layer int, pass moe.Pass, partial []float32) []float32 {
	n, D, B := c.group.Size(), c.hidden, c.batch
	sl := c.seq / n
	out := make([]float32, len(partial)/n)
	c.record(layer, pass, parallel.CollReduceScatter, c.act, len(partial))
	if c.err != nil {
		return out
	}
	in := make([]float32, 0, len(partial))
	for m := 0; m < n; m++ {
		for b := 0; b < B; b++ {
			in = append(in, partial[(b*c.seq+m*sl)*D:(b*c.seq+m*sl+sl)*D]...)
		}
	}
	if err := c.ep.ReduceScatter(c.ctx, c.group, c.act, in, out); err != nil {
		c.fail(err)
	}
	return out
}

// AllReduce implements ref.TPComm (loss parallel's fp32 reductions).
func (c *tpComm) AllReduce(layer int, v []float32, max bool) {
	c.record(layer, moe.Forward, parallel.CollAllReduce, moe.F32, len(v))
	if c.err != nil {
		return
	}
	var err error
	if max {
		err = c.ep.AllReduceMax(c.ctx, c.group, moe.F32, v)
	} else {
		err = c.ep.AllReduce(c.ctx, c.group, moe.F32, v)
	}
	if err != nil {
		c.fail(err)
	}
}

// ExpertsDone implements ref.TPComm.
func (c *tpComm) ExpertsDone(layer int) {
	if c.err == nil && c.expertsDone != nil {
		if err := c.expertsDone(layer); err != nil {
			c.fail(err)
		}
	}
}

// ExpertTokens implements ref.TPComm: with ep > 1 at etp = 1 the member's
// contiguous 1/tp of the tokens, else all.
func (c *tpComm) ExpertTokens(tokens int) (lo, hi int) {
	if !c.splitRows {
		return 0, tokens
	}
	n := tokens / c.group.Size()
	return c.idx * n, (c.idx + 1) * n
}

// tpPiece returns this rank's piece of parameter p (whole in full): split
// over tp by its tp index, or, for routed experts, over Layout.ExpertTP by
// its expert-TP index.
func (r *numRank) tpPiece(p moe.Param, full []float32) []float32 {
	n, idx := r.tpSplit(p)
	return ref.TPShard(p, full, n, idx)
}

// tpSplit is the degree and member index p is split by on this rank.
func (r *numRank) tpSplit(p moe.Param) (n, idx int) { return tpSplit(r.spec.Mesh.Layout, r.coord, p) }

// tpSplit is the degree and member index parameter p is split by on the
// rank at co of a (stage) mesh of layout l: a routed expert over
// Layout.ExpertTP by the rank's etp index, the innermost factor of the
// expert mesh (parallel.Mesh: s·tp + t = (f·ep + e)·etp + j), every other
// split tensor over tp by its tp index.
func tpSplit(l job.Layout, co parallel.Coord, p moe.Param) (n, idx int) {
	tp := l.TPDegree()
	if p.Group == moe.GroupRouted {
		x := l.ExpertTP()
		return x, (co.Shard*tp + co.TP) % x
	}
	return tp, co.TP
}

// tpReduceReplicated sums over the tp group the gradients g (u's tensors,
// whole) of u's replicated tensors, which each member computed from its
// own tokens or heads.
func (r *numRank) tpReduceReplicated(ctx context.Context, ep *collective.Endpoint, u *numUnit, g [][]float32) error {
	if r.tp == nil || u.u.Experts {
		return nil
	}
	ps := r.cfg.Params()
	var rep [][]float32
	for k, ix := range u.params {
		if ps[ix[0]].TP == moe.TPReplicated {
			rep = append(rep, g[k])
		}
	}
	// The unsharded gradients' type, as parallel.TPReplicatedElements says:
	// the compute type, or the gradient type they accumulate in when
	// gradient sync waits for the last micro-step.
	dt := r.spec.storage.Compute
	if r.spec.Mesh.Layout.GradSyncLastOnly && r.spec.Batch.GradAccum > 1 {
		dt = r.spec.storage.Grad
	}
	return allReduceJoined(ctx, ep, r.tp.group, dt, rep)
}

// allReduceJoined sums gs over group g in one all-reduce of their
// concatenation in type dt, writing the sums back into gs (nothing to
// do for none): one unit's replicated gradients over its tp group, as
// the schedule issues them, for the single-program and the pipeline
// trainer alike.
func allReduceJoined(ctx context.Context, ep *collective.Endpoint, g parallel.Group, dt moe.DType, gs [][]float32) error {
	var buf []float32
	for _, v := range gs {
		buf = append(buf, v...)
	}
	if len(buf) == 0 {
		return nil
	}
	if err := ep.AllReduce(ctx, g, dt, buf); err != nil {
		return err
	}
	off := 0
	for _, v := range gs {
		off += copy(v, buf[off:])
	}
	return nil
}

// failed is the first collective error of a tp communicator (nil for no
// communicator: no tensor parallelism).
func (c *tpComm) failed() error {
	if c == nil {
		return nil
	}
	return c.err
}
