package cost

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel"
)

// The prices of the costs a real training step pays beyond its model's ops
// (package sim's overheads.go says what each is and names them in
// Breakdown.OverheadS): the token reorder of routing, FSDP2's copies
// around its collectives, gradient clipping and the host sync of the
// expert-parallel split sizes, each from what it moves at the device's
// measured rates.

const (
	routingBytesPerChoice = 256 // 8 radix passes × (read + write) × (8-byte key + 8-byte index)
	routingKernels        = 4   // histogram, sort (two kernels of a radix pass pair at least), index gather
	gradClipBytesPerParam = 12  // norm: read 4; scale: read 4, write 4
)

// RoutingSeconds is one MoE layer's forward token reorder for tokens rows.
func (c ComputeSpec) RoutingSeconds(cfg *moe.Config, tokens int64) float64 {
	choices := float64(tokens) * float64(cfg.TopK)
	return c.MemorySeconds(choices*routingBytesPerChoice) + float64(routingKernels-1)*c.LaunchS
}

// FSDPCopySeconds is the copy-in and copy-out of FSDP2 collective o over
// a group of n ranks (zeros for other collectives), in the run's types,
// split by the stream each runs on (pytorch/pytorch 010ae4a8,
// torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py and
// _fsdp_param_group.py):
//
//   - all-gather: the copy-in, which casts the shard from the parameter
//     type into the gathered type (o.DType), runs on its own copy-in stream
//     ahead of the collective (foreach_all_gather); the copy-out, which
//     splits the gathered buffer into the parameters (a read and a write
//     of it), runs on the compute stream when the unit waits for its
//     unshard (foreach_all_gather_copy_out in wait_for_unshard);
//   - reduce-scatter: the copy-in, which casts the compute-type gradients
//     into the reduce type (o.DType, chunk_cat), runs on the compute stream
//     before the reduce-scatter stream waits for it (foreach_reduce); the
//     copy-out, which adds the reduced shard into the sharded gradient (two
//     reads and a write), runs on the reduce-scatter stream after it.
//
// With torchtitan's default types (fp32 parameters and gradients, bf16
// compute) these are 6 and 4 bytes per shard and gathered element, and 6
// and 12 per gradient and shard element.
func (c ComputeSpec) FSDPCopySeconds(o parallel.ScheduleOp, n int, prec moe.Precision) (onStream, onCompute float64) {
	if n < 1 {
		n = 1
	}
	if prec == (moe.Precision{}) {
		prec = moe.DefaultPrecision
	}
	full := float64(o.Elements)
	shard := full / float64(n)
	moved := float64(o.DType.Bytes()) // per element; less with an fp8 all-gather's one-byte weights
	if o.Elements > 0 {
		moved = float64(o.Bytes()) / full
	}
	switch {
	case o.Purpose == parallel.PurposeGather:
		return c.MemorySeconds(shard * (float64(prec.Param.Bytes()) + moved)), c.MemorySeconds(2 * moved * full)
	case o.Purpose == parallel.PurposeGradReduce && o.Coll == parallel.CollReduceScatter:
		return c.MemorySeconds(shard * (moved + 2*float64(prec.Grad.Bytes()))), c.MemorySeconds(full * (float64(prec.Compute.Bytes()) + moved))
	}
	return 0, 0
}

// GradClipSeconds is clip_grad_norm_ over params parameters of the shard.
func (c ComputeSpec) GradClipSeconds(params float64) float64 {
	return 2 * c.MemorySeconds(params*gradClipBytesPerParam/2)
}

// HostSyncSeconds is the idle time of one device-to-host copy of split sizes.
func (c ComputeSpec) HostSyncSeconds() float64 { return 2 * c.LaunchS }
