package parallel

import (
	"fmt"
	"io"
	"strings"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// A Schedule is the per-rank program of one training step: compute segments
// and collectives in issue order, each on a stream, with the dependencies
// that allow prefetch and overlap, and the memory events each causes. It is a
// value built once per (model, layout, AC policy, batch); the numeric backend
// executes it with real tensors, a virtual-time backend walks it with
// modelled durations. Every rank runs the same program: the group an op runs
// on is named by its Axis and resolved per rank with Mesh.Group, and its
// byte counts are per rank.
//
// Execution rules shared by both backends:
//   - ops of one stream start in list order, each after the previous op of
//     that stream has finished;
//   - an op also waits for every op in Deps to finish;
//   - memory follows the memory package's timeline, the one source of peak
//     memory: Setup, then each op's Mem in op order, is that timeline
//     event for event (memory.Replay gives Peak).
type Schedule struct {
	Layout    job.Layout
	AC        moe.AC
	LBS       int // sequences per rank per micro-step
	Seq       int // tokens per sequence
	GradAccum int // micro-steps per optimizer step (grad-accum)
	Ops       []ScheduleOp
	Setup     []memory.Event // what is live when the step begins
	Peak      memory.Peak    // memory.Replay of the timeline
}

// Timeline returns the step's memory events in order: Setup, then every
// op's Mem.
func (s *Schedule) Timeline() []memory.Event {
	out := append([]memory.Event(nil), s.Setup...)
	for _, o := range s.Ops {
		out = append(out, o.Mem...)
	}
	return out
}

// Stream is the queue an op runs on.
type Stream uint8

// Streams of a rank.
const (
	StreamCompute Stream = iota
	StreamComm
)

func (s Stream) String() string {
	if s == StreamComm {
		return "comm"
	}
	return "compute"
}

// Phase is when a compute op runs.
type Phase uint8

// Phases of a step.
const (
	PhaseForward   Phase = iota
	PhaseRecompute       // forward of a fully checkpointed block (or of a MoE layer under modules:moe), re-run before its backward
	PhaseBackward        // backward_data + backward_weight (plus selective recompute inside it)
	PhaseOptimizer       // AdamW on this rank's shard
)

var phaseNames = [...]string{"forward", "recompute", "backward", "optimizer"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "phase?"
}

// Segment is a contiguous piece of a layer's compute between collectives.
// The ops of the vocabulary belong to segments as SegmentOf says.
type Segment string

// Segments of the model's graph.
const (
	SegEmbed   Segment = "embed"   // LayerEmbed: embedding gather
	SegBlock   Segment = "block"   // a dense block whole
	SegPre     Segment = "pre"     // MoE block: attention half, ffn_norm, router, top-k, dispatch permute
	SegExperts Segment = "experts" // MoE block: grouped expert GEMMs and activation
	SegPost    Segment = "post"    // MoE block: combine, shared experts, residuals
	SegHead    Segment = "head"    // LayerHead: final norm, LM head, loss
	SegUpdate  Segment = "update"  // optimizer step
)

// SegmentOf returns the segment op belongs to in a block of the given kind
// (moeLayer), so per-op tables can be summed per schedule op.
func SegmentOf(op moe.Op, moeLayer bool) Segment {
	switch op {
	case moe.OpEmbed:
		return SegEmbed
	case moe.OpFinalNorm, moe.OpLMHead, moe.OpLoss:
		return SegHead
	case moe.OpOptimizer:
		return SegUpdate
	}
	if !moeLayer {
		return SegBlock
	}
	switch op {
	case moe.OpExpertGate, moe.OpExpertUp, moe.OpExpertAct, moe.OpExpertDown:
		return SegExperts
	case moe.OpCombine, moe.OpSharedGate, moe.OpSharedUp, moe.OpSharedAct, moe.OpSharedDown,
		moe.OpSharedExpGate, moe.OpResidual:
		return SegPost
	}
	return SegPre
}

// CollKind is a collective operation.
type CollKind string

// Collectives.
const (
	CollAllGather     CollKind = "all_gather"
	CollReduceScatter CollKind = "reduce_scatter"
	CollAllReduce     CollKind = "all_reduce"
	CollAllToAll      CollKind = "all_to_all"
	CollBroadcast     CollKind = "broadcast"
	CollBarrier       CollKind = "barrier"
)

// CollKinds lists the collectives in report order.
func CollKinds() [6]CollKind {
	return [...]CollKind{CollAllGather, CollReduceScatter, CollAllReduce, CollAllToAll, CollBroadcast, CollBarrier}
}

// Unit is a set of parameters gathered, reduced and freed together (an FSDP
// unit in torchtitan's wrapping: the embedding; per block its dense part and,
// separately, its routed experts; the final norm with the LM head).
type Unit struct {
	Layer   int  // moe.LayerEmbed, a block index, or Config.LayerHead()
	Experts bool // the routed experts of the block
}

func (u Unit) String() string {
	if u.Experts {
		return fmt.Sprintf("L%d.experts", u.Layer)
	}
	return fmt.Sprintf("L%d.dense", u.Layer)
}

// Purpose says why a collective runs.
type Purpose string

// Purposes of collectives.
const (
	PurposeGather      Purpose = "param_gather"   // FSDP all-gather before compute (compute dtype)
	PurposeGradReduce  Purpose = "grad_reduce"    // gradients over the shard axis (grad dtype)
	PurposeGradReplica Purpose = "grad_replica"   // HSDP all-reduce over replicas (grad dtype)
	PurposeRegather    Purpose = "param_regather" // ZeRO-1/2: updated shards back to full (param dtype)
	PurposeDispatch    Purpose = "dispatch"       // EP tokens to experts (activation dtype)
	PurposeCombine     Purpose = "combine"        // EP expert outputs back
	PurposeDispatchBwd Purpose = "dispatch_grad"  // gradient of dispatch (combine direction)
	PurposeCombineBwd  Purpose = "combine_grad"   // gradient of combine (dispatch direction)
	PurposeLoss        Purpose = "loss_reduce"    // step loss and aux loss over dp, f32 scalars
	PurposeBiasLoad    Purpose = "bias_load"      // per-expert loads over dp for the selection bias
	PurposeCounts      Purpose = "a2a_counts"     // per-expert token counts exchanged before dispatch (i64)
)

// OpType says whether a schedule op computes or communicates.
type OpType uint8

// Op types.
const (
	OpCompute OpType = iota
	OpCollective
)

// ScheduleOp is one entry of the program.
type ScheduleOp struct {
	ID     int
	Type   OpType
	Stream Stream
	Micro  int // micro-step, or -1 for per-step ops (optimizer, step-end collectives)
	Layer  int // moe.LayerEmbed, block index or LayerHead
	Deps   []int

	// Compute ops.
	Phase   Phase
	Segment Segment

	// Collectives: Coll on the rank's group of Axis, moving Elements
	// elements of DType. Elements is the collective's size S as NCCL
	// names it: the gathered output of an all-gather, the unsharded input
	// of a reduce-scatter, the buffer of an all-reduce or broadcast, and
	// for an all-to-all the rows this rank sends (self included) times the
	// row width, under uniform routing unless counts were given.
	Coll     CollKind
	Axis     Axis
	Purpose  Purpose
	Unit     Unit
	DType    moe.DType
	Elements int64
	// FP8Elements are the Elements moved in fp8 (one byte) rather than
	// DType: the weights an fp8 all-gather gathers (job.Recipe.GathersFP8).
	FP8Elements int64
	// AsyncPart marks the overlapped part of an async tensor-parallel
	// collective: it runs beside compute instead of before it.
	AsyncPart bool

	// Mem are the memory package's timeline events that happen at this op
	// (see Schedule.Setup).
	Mem []memory.Event
}

// Bytes is Elements × DType size, but one byte for each of FP8Elements.
func (o ScheduleOp) Bytes() int64 {
	return (o.Elements-o.FP8Elements)*o.DType.Bytes() + o.FP8Elements
}

// String prints one line.
func (o ScheduleOp) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%4d %-7s m%-2d ", o.ID, o.Stream, o.Micro)
	if o.Type == OpCompute {
		fmt.Fprintf(&b, "L%-3d %s %s", o.Layer, o.Phase, o.Segment)
	} else {
		fmt.Fprintf(&b, "L%-3d %s %s on %s: %d × %s = %d B", o.Layer, o.Coll, o.Purpose, o.Axis, o.Elements, o.DType, o.Bytes())
		if o.Purpose == PurposeGather || o.Purpose == PurposeGradReduce || o.Purpose == PurposeGradReplica || o.Purpose == PurposeRegather {
			fmt.Fprintf(&b, " (%s)", o.Unit)
		}
	}
	if len(o.Deps) > 0 {
		fmt.Fprintf(&b, " after %v", o.Deps)
	}
	for _, e := range o.Mem {
		sign := "-"
		if e.Alloc {
			sign = "+"
		}
		fmt.Fprintf(&b, " %s%s:%d", sign, e.Label, e.Bytes)
	}
	return b.String()
}

// Print writes the program, one op per line.
func (s *Schedule) Print(w io.Writer) error {
	if _, err := fmt.Fprintf(w, "schedule: %d ops, %d micro-step(s), lbs %d, seq %d, ac %s\n", len(s.Ops), s.GradAccum, s.LBS, s.Seq, s.AC); err != nil {
		return err
	}
	for _, o := range s.Ops {
		if _, err := fmt.Fprintln(w, o.String()); err != nil {
			return err
		}
	}
	return nil
}
