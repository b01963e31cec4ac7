package sim

import (
	"fmt"

	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
)

// Context parallelism inside pipeline stages. The mesh is torchtitan's
// (v0.2.2 73a0e69 distributed/parallel_dims.py: pp outermost, then
// dp_replicate, dp_shard, cp, tp), so a stage is the mesh of a run without
// pipelining and a cp rank of it runs the folded stage (cp into dp_shard,
// seq/cp tokens, job.Spec.FoldCP), as Prepare folds a step:
//   - each stage's forward and backward of one micro-batch hold its
//     blocks' K/V exchanges (cpExchange at pp_microbatch_size sequences,
//     on the cp group of stage 0's first ranks, 0, tp, …, (cp−1)·tp: every
//     stage's groups have that shape), their exposed part inside the
//     compute as without a pipeline (chargeCP), the input pass of a
//     zero-bubble schedule holding the backward's;
//   - the pipeline's messages are a cp and tp rank's shard, seq/cp/tp
//     tokens × hidden (Megatron-LM d98e8a64 megatron/core/
//     pipeline_parallel/schedules.py get_tensor_shapes divides the
//     sequence by cp and tp);
//   - the breakdown names each CP collective (cpCollNames): exposed out of
//     the compute it sits in, comm_s the whole exchange.

// cpFold is in as one cp rank runs it: the K/V exchange placed on cl and
// the spec folded (job.Spec.FoldCP); in itself without CP. The exchange's
// shard is a micro-step's (lbs sequences) or, under pp, a pipeline
// micro-batch's (pp_microbatch_size).
func cpFold(in Input, cl *hw.Cluster) (Input, error) {
	if in.CPDegree() == 1 {
		return in, nil
	}
	if err := in.CheckSeq(in.Seq); err != nil {
		return in, fmt.Errorf("simulate: %w", err)
	}
	mb := in.Spec
	if in.Layout.Stages() > 1 {
		mb.LBS = in.PPMicrobatchSize
	}
	in.cp = newCPExchange(mb, cl)
	in.Spec = in.Spec.FoldCP()
	return in, nil
}

// cpIn is the CP exchange inside pipeline compute op o, nil for none: a
// forward's, and a backward's wherever attention's backward runs (as tpIn).
func (c pipeCosts) cpIn(o parallel.PipeOp) *cpCharge {
	if c.cpFwd == nil {
		return nil
	}
	s := o.Stage
	switch {
	case o.Kind == parallel.PipeForward:
		return &c.cpFwd[s]
	case o.Kind == parallel.PipeBackward, s == 0 && o.Kind == parallel.PipeWeight, s > 0 && o.Kind == parallel.PipeInput:
		return &c.cpBwd[s]
	}
	return nil
}

// cpBreakdown moves the rank's CP exchange (cp) out of b's compute into
// its collectives' exposed seconds and puts the whole exchange in comm_s.
func cpBreakdown(b *Breakdown, cp cpCharge) {
	for k, name := range cpCollNames {
		if cp.total[k] == 0 {
			continue
		}
		b.ComputeS -= cp.exposed[k]
		b.ExposedCommS[name] += cp.exposed[k]
		b.CommS[name] += cp.total[k]
	}
}
