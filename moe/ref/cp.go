package ref

import (
	"github.com/moescope/moescope/moe/attn"
	"github.com/moescope/moescope/moe/ref/rope"
)

// AttentionStage runs a block's attention in place of attn.Forward and
// attn.Backward: the seam where context parallelism exchanges keys and
// values between the ranks that each hold part of every sequence. The
// block then holds a.Batch sequences of a.Seq local tokens (positions set
// by SetPositions); q [T, H·D], k, v [T, G·D], o [T, H·D], lse [T, H] are
// the local tokens' (T = a.Batch·a.Seq). AttentionForward writes o and lse
// over every key of the whole sequence the mask lets each query see;
// AttentionBackward accumulates dq, dk, dv of the local tokens (dk and dv
// summed over every rank whose queries saw them). Both return the score
// entries they executed summed over the sequences, per head: what the
// block records as the attention's work (a.Area()·a.Batch locally). The
// slices are the block's step buffers, reused by its next step
// (model_block_scratch.go): a stage must not keep them past the call.
type AttentionStage[T Float] interface {
	AttentionForward(layer int, o, lse, q, k, v []T, a attn.Shape) (area int64)
	AttentionBackward(layer int, dq, dk, dv, do, q, k, v, o, lse []T, a attn.Shape) (area int64)
}

// SetPositions makes RoPE rotate the block's local token p of every
// sequence by pos[p], its index in the whole sequence, instead of p: a
// context-parallel rank's shard keeps the positions of the original
// tokens (PyTorch's context_parallel shards the position ids with the
// tokens), and Llama 4's temperature scales by those positions. len(pos) must be the block's seq.
func (b *Block[T]) SetPositions(pos []int) {
	if len(pos) != b.seq {
		panic("moe: Block.SetPositions needs one position per local token")
	}
	b.rope = rope.TableAt[T](b.cfg, pos)
	b.temp = rope.Temperatures(b.cfg, b.layer, b.seq, pos)
}
