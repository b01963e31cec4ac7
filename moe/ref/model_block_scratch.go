package ref

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/ref/scratch"
)

// A block's step allocates tens of activation and gradient buffers of up to
// T·K·D elements; made afresh every step they cost a clear on one core and,
// once the collector has returned the memory, page faults. The block takes
// them from a scratch lease instead:
//
//   - Forward, ForwardSP: the previous step's buffers go back to the pool
//     first (nothing reads them: the state that held them is replaced);
//     after keep(), those the checkpointing policy dropped go back too
//     (scratch.Lease.Retain over what the block still holds), so a
//     recomputation or backward reuses them;
//   - Backward, BackwardSP: everything goes back at the end.
//
// What escapes is made, never leased: Forward's output, Backward's dx, the
// routing and counts the accessors return, and the rows handed to an
// ExpertStage other than the local one (it may keep them).

// buf returns n zeroed elements for the block's own use within a step: from
// the lease, or made while weight gradients are deferred (a queued GEMM
// reads its inputs after Backward has returned).
func (b *Block[T]) buf(n int) []T {
	if b.x.wq != nil {
		return make([]T, n)
	}
	return b.scratch.Get(n)
}

// stageBuf is buf for the rows the block hands an ExpertStage: made when
// the stage is not the block's own (Block.Experts may keep them).
func (b *Block[T]) stageBuf(n int) []T {
	if b.Experts != nil {
		return make([]T, n)
	}
	return b.buf(n)
}

// outBuf is the block's output: made in the forward pass (it escapes to
// the caller), scratch in a recomputation (dropped).
func (b *Block[T]) outBuf(pass moe.Pass, n int) []T {
	if pass == moe.Forward {
		return make([]T, n)
	}
	return b.buf(n)
}

// retainKept hands back to the pool every leased buffer the block no longer
// holds after keep(): those in neither its state nor its local experts'.
func (b *Block[T]) retainKept() { b.scratch.Retain(&b.st, &b.local) }

// shareScratch makes the block lease from p: a Model's blocks share one pool,
// so a layer's dropped or released buffers serve the next layer.
func (b *Block[T]) shareScratch(p *scratch.Pool[T]) { b.scratch = p.Lease() }
