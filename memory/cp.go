package memory

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// Context parallelism (job/cp.go) splits each sequence over cp ranks. A
// rank holds the tokens of its shard only, so the training step's memory
// is that of the layout with cp folded into dp_shard (FSDP shards over
// dp_shard·cp, torchtitan's fsdp mesh) at seq/cp tokens per sequence
// (job.Spec.FoldCP): activations, saved tensors, the logits and the loss
// all divide by cp. Attention alone reaches beyond the shard: the keys and
// values of the other cp ranks are received into buffers that live while
// the block's attention runs (cpBuffers).

// foldCP is (l, b) with cp folded (job.Layout.FoldCP) and the degree it
// folded (1 without CP).
func foldCP(l job.Layout, b Batch) (job.Layout, Batch, int) {
	cp := l.CPDegree()
	if cp == 1 {
		return l, b, 1
	}
	b.Seq /= cp
	return l.FoldCP(), b, cp
}

// cpShape is the degree foldCP folded and the method of the K/V exchange.
type cpShape struct {
	cp     int
	method job.CPMethod
}

// set gives a folded run's shape its K/V exchange (stepBuilder's
// cpBuffers).
func (c cpShape) set(sh *Shape) { sh.CP, sh.CPMethod = c.cp, c.method }

// cpBuffers returns the bytes of the K/V exchange buffers one block holds
// while its attention runs forward and backward, with kv the bytes of the
// K and V of one rank's shard (lbs·seq/cp tokens × kv_heads/tp ×
// head_dim × 2, activation type); 0 without CP.
//   - forward, every method: cp shards of K and V, the whole sequence's
//     (TransformerEngine d0067d0da context_parallel.py:
//     AttnFuncWithCPAndKVAllGather.forward gathers k_ag and v_ag;
//     AttnFuncWithCPAndKVP2P.forward keeps every step's receive buffer in
//     p2p_comm_buffers until its loop ends, cp of them);
//   - backward, all-gather: the K/V gathered again and their gradients
//     at full length before the reduce-scatter (AttnFuncWithCPAndKVAllGather
//     .backward: k_ag, v_ag and dk, dv over the gathered length), 2·cp
//     shards;
//   - backward, ring: the held and the received K/V and the dK/dV being
//     sent and received (AttnFuncWithCPAndKVP2P.backward: kv,
//     kv_recv_buffer, dkv_send_buffer, dkv_recv_buffer), 4 shards.
//
// PyTorch's context_parallel (torchtitan's) rotates or gathers the same
// tensors; its buffers are taken to be TE's.
func cpBuffers(cp int, method job.CPMethod, kv int64) (fwd, bwd int64) {
	if cp == 1 {
		return 0, 0
	}
	fwd = int64(cp) * kv
	if method.Ring() {
		return fwd, 4 * kv
	}
	return fwd, 2 * int64(cp) * kv
}

// cpBackward emits block unit i's backward K/V exchange buffers (cpBwd),
// live while its attention's backward runs: in a full backward and in a
// zero-bubble schedule's input pass, which runs attention's backward.
func (s *stepBuilder) cpBackward(i int) {
	u := s.units[i]
	if u.Layer == moe.LayerEmbed || s.isHead(i) {
		return
	}
	s.alloc(u.Layer, "cp_kv_bwd", s.cpBwd, CatComm)
	s.free(u.Layer, "cp_kv_bwd", s.cpBwd, CatComm)
}
