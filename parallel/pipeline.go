package parallel

import (
	"errors"
	"fmt"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// A Pipeline is the program of one training step under pipeline
// parallelism (pp > 1): one op list per pipeline rank, in issue order.
// Each rank runs the actions job.PipelineOrder gives it, one pipeline
// micro-batch each, framed by the point-to-point transfers between
// neighbouring stages (stage s on pp rank job.Layout.StageRank(s): s mod
// pp, or in a V; pp is the outermost mesh axis, so pp rank p's
// data-parallel rank d is global rank p·DP + d and talks to the same d of
// the neighbouring stage):
//
//   - forward of stage s: receive its input activation from stage s − 1
//     (not on stage 0), compute, send the output to stage s + 1 (not on
//     the last stage);
//   - backward (or backward-input pass) of stage s: receive the output's
//     gradient from stage s + 1 (not on the last stage), compute, send the
//     input's gradient to stage s − 1 (not on stage 0) as soon as it is
//     computed;
//   - backward-weight pass: compute only.
//
// Two neighbouring stages on one rank (the bottom of a V, stages pp − 1
// and pp) exchange nothing: PyTorch hands the tensor over in place
// (schedules.py's "V-schedule special case").
//
// Messages are one micro-batch's hidden states, pp_microbatch_size × seq
// × hidden elements of the activation type, divided by tp under tensor
// parallelism: each tp rank sends its sequence-parallel shard to the same
// tp rank of the next stage (torchtitan v0.2.2, 73a0e69:
// models/qwen3/infra/parallelize.py apply_non_moe_tp gives the embedding
// output_layouts=Shard(1) and each block's attention.wo and feed_forward.w2
// (or MoE) rowwise_parallel(output_layouts=Shard(1)) with the default
// use_local_output=True, so a block's output, and a stage's, is the local
// [batch, seq/tp, hidden] tensor that PipelineStage sends; the first
// block's attention_norm of the next stage takes it as its Shard(1) input).
// Each stage's forward and backward run its layers' tensor-parallel
// collectives (StageTPCollectives) on the stage's tp group. Inside a
// stage, FSDP follows torchtitan under PP as job.PipelineStep decides for
// every backend: the stage's units are all-gathered before its first
// action of the step and stay gathered, and their gradients are reduced
// once, after the micro-step's last full backward or weight pass of the
// stage.
// Each of the grad-accum micro-steps runs the whole order; the optimizer
// runs after the last.
type Pipeline struct {
	Layout    job.Layout
	Split     []int // transformer layers per stage (job.Layout.StageSplit)
	M         int   // pipeline micro-batches per accumulation micro-step
	GradAccum int   // accumulation micro-steps
	Ranks     [][]PipeOp
	// Stage is the mesh of one stage's data-parallel ranks (the groups of
	// the FSDP and EP collectives inside a stage).
	Stage *Mesh
}

// PipeOpKind says what a pipeline op does.
type PipeOpKind uint8

// Pipeline op kinds.
const (
	PipeForward  PipeOpKind = iota // one micro-batch through a stage
	PipeBackward                   // its backward
	PipeSend                       // a message to the neighbouring stage's rank
	PipeRecv                       // the matching receive
	PipeColl                       // an FSDP collective of the stage (Coll holds it)
	PipeInput                      // the backward-input pass of a micro-batch (zero-bubble schedules)
	PipeWeight                     // its backward-weight pass
)

var pipeOpNames = [...]string{"forward", "backward", "send", "recv", "collective", "backward_input", "backward_weight"}

func (k PipeOpKind) String() string { return pipeOpNames[k] }

// PipeOp is one op of a pipeline rank.
type PipeOp struct {
	Kind  PipeOpKind
	Stage int // the stage the op belongs to (for a send or receive: this rank's stage)
	Micro int // micro-batch in the step, accumulation micro-step × M + micro-batch; -1 for FSDP collectives
	// Send and receive: Peer is the other stage, Grad whether the message is
	// a gradient (backward) rather than an activation, Bytes its size.
	Peer  int
	Grad  bool
	Bytes int64
	// Collectives: the op as the single-rank Schedule writes it (Coll,
	// Axis on the stage mesh, Purpose, Unit, DType, Elements).
	Coll ScheduleOp
}

// PipelineSpec is what a pipeline program is built from: the run (its
// Layout resolved, pp > 1; its recipe's storage and reduce types are what
// the stages move, empty fields job.DefaultRecipe's) and the GPUs per host
// its ranks are placed on.
type PipelineSpec struct {
	job.Spec
	GPUsPerNode int
}

// BuildPipeline builds the per-rank programs of one step (see Pipeline).
func BuildPipeline(sp PipelineSpec) (*Pipeline, error) {
	cfg, l := sp.Model, sp.Layout
	if cfg == nil {
		return nil, errors.New("pipeline: config is required")
	}
	if l.Stages() < 2 {
		return nil, fmt.Errorf("pipeline: pp = %d: a pipeline needs pp ≥ 2", l.PP)
	}
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	if err := l.CheckModel(cfg); err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	if sp.Seq < 1 || sp.GradAccum < 1 {
		return nil, fmt.Errorf("pipeline: seq = %d, grad_accum = %d: each must be ≥ 1", sp.Seq, sp.GradAccum)
	}
	if err := sp.Recipe.Resolve(); err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	if err := l.CheckSeq(sp.Seq); err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	m, err := l.Microbatches(sp.LBS)
	if err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	split, err := l.StageSplit(cfg.Layers)
	if err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	order, err := job.PipelineOrder(l.PPSchedule, l.Stages(), l.VirtualStages(), m)
	if err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	stage, err := NewMesh(l.StageLayout(), cfg, sp.GPUsPerNode)
	if err != nil {
		return nil, fmt.Errorf("pipeline: stage %w", err)
	}
	prec := sp.Storage()
	p := &Pipeline{Layout: l, Split: split, M: m, GradAccum: sp.GradAccum, Ranks: make([][]PipeOp, l.Stages()), Stage: stage}
	b := &schedBuilder{cfg: cfg, paramIx: NewUnitIndex(cfg), m: stage, l: stage.Layout, prec: prec,
		sp: ScheduleSpec{Spec: job.Spec{Recipe: sp.Recipe}}}
	msg := int64(l.PPMicrobatchSize) * int64(sp.Seq) / int64(l.TPDegree()) * int64(cfg.Hidden) * prec.Activation.Bytes()
	n := l.PipelineStages()
	for r, steps := range job.PipelineStep(order, m, sp.GradAccum) {
		var ops []PipeOp
		for _, a := range steps {
			micro := a.Accum*m + a.Micro
			// remote: the neighbouring stage runs on another rank.
			remote := func(peer int) bool { return l.StageRank(peer) != r }
			if a.Gather {
				ops = append(ops, p.stageCollectives(b, a.Stage, false)...)
			}
			switch a.Kind {
			case job.PipeF:
				if a.Stage > 0 && remote(a.Stage-1) {
					ops = append(ops, PipeOp{Kind: PipeRecv, Stage: a.Stage, Micro: micro, Peer: a.Stage - 1, Bytes: msg})
				}
				ops = append(ops, PipeOp{Kind: PipeForward, Stage: a.Stage, Micro: micro})
				if a.Stage < n-1 && remote(a.Stage+1) {
					ops = append(ops, PipeOp{Kind: PipeSend, Stage: a.Stage, Micro: micro, Peer: a.Stage + 1, Bytes: msg})
				}
			case job.PipeB, job.PipeI:
				if a.Stage < n-1 && remote(a.Stage+1) {
					ops = append(ops, PipeOp{Kind: PipeRecv, Stage: a.Stage, Micro: micro, Peer: a.Stage + 1, Grad: true, Bytes: msg})
				}
				kind := PipeBackward
				if a.Kind == job.PipeI {
					kind = PipeInput
				}
				ops = append(ops, PipeOp{Kind: kind, Stage: a.Stage, Micro: micro})
				if a.Stage > 0 && remote(a.Stage-1) {
					ops = append(ops, PipeOp{Kind: PipeSend, Stage: a.Stage, Micro: micro, Peer: a.Stage - 1, Grad: true, Bytes: msg})
				}
			case job.PipeW:
				ops = append(ops, PipeOp{Kind: PipeWeight, Stage: a.Stage, Micro: micro})
			}
			if a.Reduce {
				ops = append(ops, p.stageCollectives(b, a.Stage, true)...)
			}
		}
		p.Ranks[r] = ops
	}
	return p, nil
}

// StageUnits lists stage s's FSDP units in forward order: the embedding on
// stage 0, its blocks (dense part, then routed experts, as the schedule
// wraps them), the head on the last stage.
func (p *Pipeline) StageUnits(cfg *moe.Config, s int) []Unit {
	var us []Unit
	if s == 0 {
		us = append(us, Unit{Layer: moe.LayerEmbed})
	}
	first := 0
	for k := range s {
		first += p.Split[k]
	}
	for l := first; l < first+p.Split[s]; l++ {
		us = append(us, Unit{Layer: l})
		if cfg.MoELayer[l] {
			us = append(us, Unit{Layer: l, Experts: true})
		}
	}
	if s == len(p.Split)-1 {
		us = append(us, Unit{Layer: cfg.LayerHead()})
	}
	return us
}

// stageLayerIDs is stage s's layers in forward order: the embedding on
// stage 0, its blocks, the head on the last stage.
func (p *Pipeline) stageLayerIDs(cfg *moe.Config, s int) []int {
	first, count := p.StageLayers(s)
	layers := make([]int, 0, count+2)
	if s == 0 {
		layers = append(layers, moe.LayerEmbed)
	}
	for layer := first; layer < first+count; layer++ {
		layers = append(layers, layer)
	}
	if s == len(p.Split)-1 {
		layers = append(layers, cfg.LayerHead())
	}
	return layers
}

// StageTPCollectives lists the tensor-parallel collectives of one
// micro-batch through stage s in issue order (TPCollectives per layer on
// the stage's layout): the forward's, embedding (stage 0), blocks, head
// (last stage); then the backward's, head, blocks in reverse, embedding,
// each block's recompute collectives before its backward ones. Empty
// without tensor parallelism.
func (p *Pipeline) StageTPCollectives(cfg *moe.Config, s, seq int, ac moe.AC, act moe.DType) []TPColl {
	tokens := p.Layout.PPMicrobatchSize * seq
	layers := p.stageLayerIDs(cfg, s)
	per := make([][]TPColl, len(layers))
	var out []TPColl
	for i, layer := range layers {
		per[i] = TPCollectives(cfg, p.Stage.Layout, layer, tokens, ac, act)
		for _, c := range per[i] {
			if c.Phase == PhaseForward {
				out = append(out, c)
			}
		}
	}
	for i := len(layers) - 1; i >= 0; i-- {
		for _, c := range per[i] {
			if c.Phase != PhaseForward {
				out = append(out, c)
			}
		}
	}
	return out
}

// StageLayers returns the first transformer layer of stage s and how
// many it holds.
func (p *Pipeline) StageLayers(s int) (first, count int) {
	for k := range s {
		first += p.Split[k]
	}
	return first, p.Split[s]
}

// stageCollectives are stage s's FSDP collectives: the all-gathers of its
// units (reduce false) or the reduction of their gradients (reduce true,
// backward order), as the single-rank schedule emits them on the stage
// mesh; none on one-member groups or without sharding of that kind.
func (p *Pipeline) stageCollectives(b *schedBuilder, s int, reduce bool) []PipeOp {
	us := p.StageUnits(b.cfg, s)
	var ops []PipeOp
	add := func(o ScheduleOp) { ops = append(ops, PipeOp{Kind: PipeColl, Stage: s, Micro: -1, Coll: o}) }
	if !reduce {
		if !b.fsdp() {
			return nil
		}
		for _, u := range us {
			a := b.shardAxis(u)
			if b.axisSize(a) > 1 {
				_, padded, _ := b.sizes(u)
				add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: -1, Layer: u.Layer, Coll: CollAllGather, Axis: a,
					Purpose: PurposeGather, Unit: u, DType: b.prec.Compute, Elements: padded, FP8Elements: b.fp8Padded(u)})
			}
		}
		return ops
	}
	for i := len(us) - 1; i >= 0; i-- {
		u := us[i]
		if e := TPReplicatedElements(b.paramIx, u); b.l.TPDegree() > 1 && e > 0 {
			// The stage's gradients of a micro-step are accumulated
			// unsharded in the reduce type over its micro-batches
			// without gradient sync (FSDP2's no-sync accumulation): the
			// all-reduce of the replicated ones runs in that type, or in
			// the compute type after a single backward.
			dt := b.prec.Compute
			if p.M > 1 {
				dt = b.reduceType()
			}
			add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: -1, Layer: u.Layer, Coll: CollAllReduce, Axis: AxisTP,
				Purpose: PurposeTPGradSync, Unit: u, DType: dt, Elements: e})
		}
		a := b.shardAxis(u)
		n := b.axisSize(a)
		full, padded, shard := b.sizes(u)
		switch b.l.Sharding {
		case job.ShardFSDP, job.ShardZeRO2:
			if n > 1 {
				add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: -1, Layer: u.Layer, Coll: CollReduceScatter, Axis: a,
					Purpose: PurposeGradReduce, Unit: u, DType: b.reduceType(), Elements: padded})
			}
		default:
			shard = full
			if n > 1 {
				add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: -1, Layer: u.Layer, Coll: CollAllReduce, Axis: a,
					Purpose: PurposeGradReduce, Unit: u, DType: b.reduceType(), Elements: full})
			}
		}
		if b.l.DPReplicate > 1 {
			add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: -1, Layer: u.Layer, Coll: CollAllReduce, Axis: AxisReplicate,
				Purpose: PurposeGradReplica, Unit: u, DType: b.reduceType(), Elements: shard})
		}
	}
	return ops
}
