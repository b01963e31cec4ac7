package numeric

import (
	"context"
	"math"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/attn"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// cpAttention is one rank's context-parallel attention (ref.AttentionStage)
// on its cp group: its queries against every member's keys and values,
// exchanged as the method says.
//
//	allgather (torchtitan v0.2.2's default rotate method, Megatron-Core's
//	  --cp-comm-type allgather): forward all-gathers K/V and runs the
//	  member blocks in member order; backward all-gathers them again and
//	  reduce-scatters every member block's dK/dV to its owner.
//	p2p, alltoall (a ring: Megatron-Core's default p2p; torchtitan's
//	  alltoall rotation): cp steps, each running the block held and then
//	  passing it to the next member (idx+1) and taking the previous one's;
//	  backward passes K/V with the dK/dV accumulated so far, and one last
//	  hop brings each block's dK/dV home. A hop is an all-to-all whose only
//	  non-empty split goes to the next member: the bytes of a send/receive.
//
// Collectives run at the activation dtype. A failed collective is kept in
// err (the block's interface has no error) and ends the step at the next
// check (numRank.stageErr).
type cpAttention struct {
	ctx   context.Context
	ep    *collective.Endpoint
	group parallel.Group
	idx   int
	ring  bool
	pos   [][]int // pos[j]: the sequence positions member j holds
	dt    moe.DType
	err   error
	// scores counts the score entries this rank's forwards executed per
	// head, summed over sequences (the attention work the balancer evens out).
	scores int64
}

// newCPAttention returns rank's stage on its cp group of the folded mesh
// m, or nil without context parallelism.
func newCPAttention(m *parallel.Mesh, rank int, spec *Spec) *cpAttention {
	cp := spec.CP.degree()
	if cp == 1 {
		return nil
	}
	g := cpGroup(m, rank, cp)
	s := &cpAttention{group: g, idx: g.IndexOf(rank), ring: spec.CP.Method.Ring(), dt: spec.storage.Activation}
	for j := range g.Ranks {
		s.pos = append(s.pos, spec.CP.Positions(spec.Batch.Seq, j))
	}
	return s
}

// attach makes block b run its attention on the stage, its tokens at
// their positions in the whole sequence (nothing without cp).
func (s *cpAttention) attach(b *ref.Block[float32]) {
	if s != nil {
		b.SetPositions(s.pos[s.idx])
		b.Attention = s
	}
}

func (s *cpAttention) bind(ctx context.Context, ep *collective.Endpoint) {
	s.ctx, s.ep, s.err = ctx, ep, nil
}

func (s *cpAttention) failed() error {
	if s == nil {
		return nil
	}
	return s.err
}

func (s *cpAttention) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// hop passes buf (rows of width elements) to the next member and returns
// the previous member's.
func (s *cpAttention) hop(buf []float32, width int) []float32 {
	n := s.group.Size()
	counts := make([]int, n)
	counts[(s.idx+1)%n] = len(buf) / width
	out, _, err := s.ep.AllToAll(s.ctx, s.group, s.dt, buf, counts, width)
	if err != nil {
		s.fail(err)
		return make([]float32, len(buf))
	}
	return out
}

// gather returns every member's packed K/V, member order.
func (s *cpAttention) gather(kv []float32) [][]float32 {
	all, err := s.ep.AllGather(s.ctx, s.group, s.dt, kv)
	if err != nil {
		s.fail(err)
		all = make([]float32, len(kv)*s.group.Size())
	}
	out := make([][]float32, s.group.Size())
	for j := range out {
		out[j] = all[j*len(kv) : (j+1)*len(kv)]
	}
	return out
}

// AttentionForward is ref.AttentionStage's forward.
func (s *cpAttention) AttentionForward(layer int, o, lse, q, k, v []float32, a attn.Shape) int64 {
	n := s.group.Size()
	w := a.KV * a.D
	kv := attn.PackKV(k, v, w)
	clear(o)
	for i := range lse {
		lse[i] = float32(math.Inf(-1))
	}
	o2, lse2 := make([]float32, len(o)), make([]float32, len(lse))
	var area int64
	run := func(owner int, blk []float32) {
		area += attn.BlockForward(o2, lse2, q, blk, s.pos[s.idx], s.pos[owner], a)
		attn.MergeBlock(o, lse, o2, lse2, a.D)
	}
	if !s.ring {
		for j, blk := range s.gather(kv) {
			run(j, blk)
		}
	} else {
		for step := 0; step < n; step++ {
			run((s.idx-step+n)%n, kv)
			if step < n-1 {
				kv = s.hop(kv, 2*w)
			}
		}
	}
	s.scores += area
	return area
}

// AttentionBackward is ref.AttentionStage's backward.
func (s *cpAttention) AttentionBackward(layer int, dq, dk, dv, do, q, k, v, o, lse []float32, a attn.Shape) int64 {
	n := s.group.Size()
	w := a.KV * a.D
	kv := attn.PackKV(k, v, w)
	delta := attn.OutputDelta(do, o, a.D)
	me := s.pos[s.idx]
	var area int64
	if !s.ring {
		blocks := s.gather(kv)
		dall := make([]float32, len(kv)*n)
		for j, blk := range blocks {
			area += attn.BlockBackward(dq, dall[j*len(kv):(j+1)*len(kv)], do, q, blk, lse, delta, me, s.pos[j], a)
		}
		mine := make([]float32, len(kv))
		if err := s.ep.ReduceScatter(s.ctx, s.group, s.dt, dall, mine); err != nil {
			s.fail(err)
		}
		attn.UnpackAddKV(dk, dv, mine, w)
		return area
	}
	// Ring: rows [T, 4·G·d] = K/V then their dK/dV so far travel together.
	dkv := make([]float32, len(kv))
	for step := 0; step < n; step++ {
		area += attn.BlockBackward(dq, dkv, do, q, kv, lse, delta, me, s.pos[(s.idx-step+n)%n], a)
		if step == n-1 {
			break
		}
		both := s.hop(joinRows(kv, dkv, 2*w), 4*w)
		kv, dkv = splitRows(both, 2*w)
	}
	attn.UnpackAddKV(dk, dv, s.hop(dkv, 2*w), w) // the last hop brings each block's dK/dV home
	return area
}

// joinRows concatenates the rows of a and b (both of width w) side by side.
func joinRows(a, b []float32, w int) []float32 {
	out := make([]float32, 0, 2*len(a))
	for t := 0; t < len(a)/w; t++ {
		out = append(out, a[t*w:(t+1)*w]...)
		out = append(out, b[t*w:(t+1)*w]...)
	}
	return out
}

// splitRows undoes joinRows.
func splitRows(ab []float32, w int) (a, b []float32) {
	for t := 0; t < len(ab)/(2*w); t++ {
		a = append(a, ab[2*t*w:(2*t+1)*w]...)
		b = append(b, ab[(2*t+1)*w:(2*t+2)*w]...)
	}
	return a, b
}

var _ ref.AttentionStage[float32] = (*cpAttention)(nil)
