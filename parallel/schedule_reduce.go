package parallel

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// reduceType is the type gradients are reduced in.
func (b *schedBuilder) reduceType() moe.DType {
	if t := b.sp.ReduceDType; t != "" {
		return t
	}
	return b.prec.Grad
}

// reduce emits the gradient collectives of u after op dep in its unit's
// backward phase ph (job.StepOrder): none when the phase accumulates
// (grad-sync-last-only before the last micro-step; the memory timeline
// keeps the unsharded gradients there instead), the replica all-reduce
// where the phase says. Under tensor parallelism the all-reduce over tp of
// u's replicated tensors' gradients comes first (TPReplicatedElements).
func (b *schedBuilder) reduce(u Unit, ph job.StepPhase, dep int) {
	if !ph.Reduce {
		return
	}
	micro := ph.Micro
	orig := dep
	if b.l.TPDegree() > 1 {
		if n := TPReplicatedElements(b.paramIx, u); n > 0 {
			dt := b.prec.Compute
			if !b.order.Reduces(0) { // reduced once, after accumulating
				dt = b.reduceType()
			}
			dep = b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: micro, Layer: u.Layer, Deps: []int{dep},
				Coll: CollAllReduce, Axis: AxisTP, Purpose: PurposeTPGradSync, Unit: u, DType: dt, Elements: n})
		}
	}
	a := b.shardAxis(u)
	n := b.axisSize(a)
	full, padded, shard := b.sizes(u)
	last := dep
	switch b.l.Sharding {
	case job.ShardFSDP, job.ShardZeRO2:
		if n > 1 {
			last = b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: micro, Layer: u.Layer, Deps: []int{dep},
				Coll: CollReduceScatter, Axis: a, Purpose: PurposeGradReduce, Unit: u, DType: b.reduceType(), Elements: padded})
		}
	default:
		shard = full
		if n > 1 {
			last = b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: micro, Layer: u.Layer, Deps: []int{dep},
				Coll: CollAllReduce, Axis: a, Purpose: PurposeGradReduce, Unit: u, DType: b.reduceType(), Elements: full})
		}
	}
	if last != orig {
		b.lastRS = append(b.lastRS, last)
		b.rsIssued(last, padded)
	}
	if ph.ReplicaReduce {
		id := b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: micro, Layer: u.Layer, Deps: []int{last},
			Coll: CollAllReduce, Axis: AxisReplicate, Purpose: PurposeGradReplica, Unit: u, DType: b.reduceType(), Elements: shard})
		b.lastRS = append(b.lastRS, id)
	}
}

// rsEntry is a gradient reduction in flight and its bucket's elements.
type rsEntry struct {
	id       int
	elements int64
}

// rsIssued records a shard-axis gradient reduction of elements and makes
// the next compute op wait for the reductions the implementation no longer
// lets run. FSDP2 keeps one in flight: a unit's post-backward waits for the
// previous unit's reduce-scatter event before its own (pytorch 010ae4a8
// _fsdp_param_group.py post_backward, comm_ctx.reduce_scatter_state).
// Megatron, before each bucket's reduction, waits for the oldest while the
// queued buckets hold more than twice the mean layer's elements
// (GradReducePipeline.wait_for_previous_grad_reduce with
// suggested_communication_unit_size): with equal layers, a layer's
// reduction waits for the experts of the layer two before it.
func (b *schedBuilder) rsIssued(id int, elements int64) {
	if b.megatron() {
		var queued int64
		for _, e := range b.rsQueue {
			queued += e.elements
		}
		for len(b.rsQueue) > 0 && queued > b.rsCap {
			b.rsWait = append(b.rsWait, b.rsQueue[0].id)
			queued -= b.rsQueue[0].elements
			b.rsQueue = b.rsQueue[1:]
		}
	} else {
		b.rsDrain()
	}
	b.rsQueue = append(b.rsQueue, rsEntry{id, elements})
}

// rsDrain makes the next compute op wait for every reduction in flight:
// FSDP2's root post-backward final callback, Megatron's
// GradReducePipeline.reset (wait_for_previous_grad_reduce(0)).
func (b *schedBuilder) rsDrain() {
	for _, e := range b.rsQueue {
		b.rsWait = append(b.rsWait, e.id)
	}
	b.rsQueue = nil
}

// megatronQueueCap is Megatron's default suggested_communication_unit_size
// under optim_grads_params: twice the mean parameter count of its FSDP
// units, the transformer layers (fully_sharded_data_parallel.py; the
// embedding and output layer are not units).
func (b *schedBuilder) megatronQueueCap() int64 {
	var total int64
	for l := 0; l < b.cfg.Layers; l++ {
		for _, u := range b.blockUnits(l, true) {
			full, _, _ := b.sizes(u)
			total += full
		}
	}
	return total / int64(b.cfg.Layers) * 2
}
