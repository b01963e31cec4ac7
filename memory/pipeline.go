package memory

import (
	"errors"
	"fmt"
	"slices"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// Memory of a pipeline stage (pp > 1). Each pipeline rank holds the units
// of its stages (job.Layout.StageSplit, on the ranks of
// job.Layout.RankStages: looped, or a V) and runs
// its actions in job.PipelineOrder's order, one pipeline micro-batch
// (pp_microbatch_size sequences) per action; each of the grad-accum
// micro-steps runs the whole order. A rank's timeline:
//
//   - Setup: its units' parameters and optimizer state; their compute
//     weights, which stay gathered for the whole step (below); and the
//     receive buffers PyTorch's PipelineStage allocates once per
//     micro-batch (stage.py at 0138610331c90b8053a0bfc6df0175b200a1cad2,
//     _prepare_forward_infra and _create_grad_recv_info): on a stage
//     with a predecessor one input activation per micro-batch, on a
//     stage with a successor one output gradient per micro-batch (T×D
//     each, activation type). They are counted at a V's bottom too
//     (stages pp − 1 and pp on one rank), where the schedule hands the
//     tensor over in place; whether PyTorch's stage still allocates them
//     there is not checked (an upper bound of m × T×D per direction).
//   - Forward of (stage, micro-batch): the stage's units as in a step
//     without pipelining, except that the first block's saved input is
//     the receive buffer (not allocated again), and that a stage with a
//     successor keeps its output until the micro-batch's backward (the
//     stage's forward cache, which autograd's backward starts from).
//   - Backward of (stage, micro-batch): the units in reverse; the input
//     gradient of the stage's first unit is freed once sent. Gradients
//     are not reduced until the micro-step's last micro-batch: PyTorch's
//     stage runs every other backward without gradient sync
//     (backward_maybe_with_nosync; FSDP2 then accumulates the unsharded
//     gradients in the reduce type, fp32, and does not reshard after
//     backward). So each unit's first backward allocates its accumulated
//     unsharded gradients (local elements × gradient type) and its last
//     reduces them as a step without pipelining does.
//   - Zero-bubble schedules split a backward into an input pass (I) and a
//     weight pass (W), PyTorch's stage_backward_input and
//     stage_backward_weight (torch/distributed/pipelining/_backward.py at
//     060ca5d783bd6935f20d77522ebb416a5c3c3d86): I runs autograd to the
//     stage's input with retain_graph, so the tensors the stage saved for
//     backward stay alive until W, and detaches the stage's output, which
//     frees the graph above its last weight GEMM (on the last stage the
//     loss's own saved tensors). Here I emits each unit's recompute,
//     workspace and input gradient and frees the workspace, the loss's
//     saved tensors, the kept output and the gradient it sends; the other
//     saved and the recomputed tensors are held until W, which allocates, accumulates
//     and reduces the weight gradients as a full backward does and frees
//     them. The gradients PyTorch's hooks capture at the split nodes
//     between I and W are not counted. On the first stage I does nothing
//     and W runs the whole backward (stage.py's backward_one_chunk skips
//     the input pass there).
//   - Optimizer over the rank's units.
//
// That is PyTorch's pipelining (layout pp_impl torch, the default). Under
// pp_impl megatron (job.PPMegatron) the stage holds Megatron-Core's p2p
// tensors instead (pipeline_megatron.go): no receive buffers in Setup; a
// received input allocated when Megatron posts its receive and held,
// as the first block's saved input, until its micro-batch's backward ends;
// a received gradient from its receive to the end of its backward; and a
// forward's output freed once sent (deallocate_pipeline_outputs), not
// kept until the backward.
//
// Compute weights: torchtitan does not reshard after forward under PP by
// default (apply_fsdp's "default" policy, reshard_after_forward = not
// pp_enabled, torchtitan 02ef790c torchtitan/models/llama3/infra/
// parallelize.py), and the stage does not reshard after backward until
// the last one, so a unit's weights stay gathered from its first forward
// to the end of the step; they are counted from Setup, which is exact from
// the first forward on. reshard_after_forward = true would free them
// between forward and the first backward only; that saving is not
// modelled (an upper bound).

// StagePeak is one pipeline rank's memory.
type StagePeak struct {
	Rank     int   `json:"rank"`
	Stages   []int `json:"stages"`    // the pipeline stages it runs
	Layers   int   `json:"layers"`    // transformer layers over those stages
	InFlight int   `json:"in_flight"` // most micro-batch activations held at once (job.InFlight)
	Peak     Peak  `json:"-"`
	// PeakAllocatedBytes and PeakReservedBytes are Peak's, for JSON.
	PeakAllocatedBytes int64 `json:"peak_allocated_bytes"`
	PeakReservedBytes  int64 `json:"peak_reserved_bytes"`
}

// StageUnits splits units (in forward order: embedding, blocks, head) over
// the pipeline stages of split (job.Layout.StageSplit): stage 0 takes the
// embedding, the last stage the head, and each stage its count of blocks
// in order.
func StageUnits(units []Unit, split []int) ([][]Unit, error) {
	if len(split) == 0 || len(units) < 2 {
		return nil, errors.New("memory: stage split needs at least one stage and the embedding and head units")
	}
	blocks := units[1 : len(units)-1]
	out := make([][]Unit, len(split))
	at := 0
	for s, n := range split {
		if s == 0 {
			out[s] = append(out[s], units[0])
		}
		if n < 0 || at+n > len(blocks) {
			return nil, fmt.Errorf("memory: stage split %v does not fit %d blocks", split, len(blocks))
		}
		out[s] = append(out[s], blocks[at:at+n]...)
		at += n
		if s == len(split)-1 {
			out[s] = append(out[s], units[len(units)-1])
		}
	}
	if at != len(blocks) {
		return nil, fmt.Errorf("memory: stage split %v covers %d of %d blocks", split, at, len(blocks))
	}
	for s, us := range out {
		if len(us) == 0 {
			return nil, fmt.Errorf("memory: pipeline stage %d of split %v holds nothing", s, split)
		}
	}
	return out, nil
}

// estimatePipeline is Estimate for pp > 1: every pipeline rank's timeline
// (see above), the report of the rank with the highest peak reserved (the
// worst stage decides whether the layout fits), with every rank's peak in
// Stages.
//
// Under context parallelism l and b are the folded run's (foldCP: a stage
// rank's shard of seq/cp tokens, so its activations, in-flight
// micro-batches and the receive buffers and messages, seq/cp/tp tokens ×
// hidden, Megatron-LM d98e8a64 megatron/core/pipeline_parallel/schedules.py
// get_tensor_shapes: (seq_length / cp / tp, micro_batch_size, hidden)),
// and each block holds its K/V exchange buffers as without a pipeline (cp).
func estimatePipeline(cfg *moe.Config, l job.Layout, b Batch, o Options, cp cpShape) (Report, error) {
	if l.AllreduceLastOnly {
		return Report{}, errors.New("memory: allreduce_last_only with pp > 1 is not modelled (the pipeline reduces once per micro-step already)")
	}
	ps, err := newPipelineSetup(cfg, l, b, o)
	if err != nil {
		return Report{}, err
	}
	cp.set(&ps.sh)
	var worst Report
	var stages []StagePeak
	// spare is the event buffer of a rank that was not the worst, which
	// the next rank fills instead of allocating its own: with hundreds of
	// micro-batches a rank's timeline is tens of megabytes.
	var spare []Event
	for r := range l.Stages() {
		rep, err := ps.rank(cfg, l, b.GradAccum, o, r, spare[:0])
		if err != nil {
			return Report{}, err
		}
		spare = nil
		sp := StagePeak{Rank: r, InFlight: job.InFlight(ps.order[r]), Peak: rep.Peak,
			PeakAllocatedBytes: rep.Peak.Allocated, PeakReservedBytes: rep.Peak.Reserved}
		for _, s := range l.RankStages(r) {
			sp.Stages = append(sp.Stages, s)
			sp.Layers += ps.split[s]
		}
		stages = append(stages, sp)
		if r == 0 || rep.Peak.Reserved > worst.Peak.Reserved {
			spare = worst.Events
			worst = rep
			worst.Stage = r
		} else {
			spare = rep.Events
		}
	}
	worst.Stages = stages
	return worst, nil
}

// pipelineSetup is what every rank's timeline of a pipelined step is built
// from: one micro-batch's shape, the micro-batches per micro-step, the
// layer split, each rank's order of actions and each stage's units.
type pipelineSetup struct {
	mb     Batch
	m      int
	split  []int
	order  [][]job.PipeAction
	chunks [][]Unit
	sh     Shape
}

func newPipelineSetup(cfg *moe.Config, l job.Layout, b Batch, o Options) (pipelineSetup, error) {
	var ps pipelineSetup
	var err error
	if ps.m, err = l.Microbatches(b.LBS); err != nil {
		return ps, err
	}
	if ps.split, err = l.StageSplit(cfg.Layers); err != nil {
		return ps, err
	}
	if ps.order, err = job.PipelineOrder(l.PPSchedule, l.Stages(), l.VirtualStages(), ps.m); err != nil {
		return ps, err
	}
	ps.mb = b
	ps.mb.LBS = l.PPMicrobatchSize
	if ps.mb, err = checkBatch(cfg, ps.mb, o.Attention); err != nil {
		return ps, err
	}
	all, err := Units(cfg, l)
	if err != nil {
		return ps, err
	}
	if ps.chunks, err = StageUnits(all, ps.split); err != nil {
		return ps, err
	}
	// Under tensor parallelism a stage's units hold their tp pieces
	// (Units), its activations are split as tpSaved says and its receive
	// buffers and sent outputs are the sequence-parallel shard, T/tp
	// tokens (stepBuilder's dx): what a tp rank sends (parallel.Pipeline).
	// Estimate has checked that the sequence splits (Layout.CheckSeq).
	ps.sh = stepShape(l, ps.mb, o)
	return ps, nil
}

// rank builds and replays pipeline rank r's timeline and returns its
// report; accum is the grad-accum micro-steps. buf, when not nil, is an
// empty buffer the timeline may reuse.
func (ps pipelineSetup) rank(cfg *moe.Config, l job.Layout, accum int, o Options, r int, buf []Event) (Report, error) {
	rep, err := ps.timeline(cfg, l, accum, o, r, buf)
	if err != nil {
		return Report{}, err
	}
	rep.Peak, err = Replay(rep.Events, *o.Allocator, o.Segments)
	return rep, err
}

// timeline is rank r's report before its replay: units, state, saved
// bytes and events, in ps.order[r]'s order of actions.
func (ps pipelineSetup) timeline(cfg *moe.Config, l job.Layout, accum int, o Options, r int, buf []Event) (Report, error) {
	mb, sh, chunks, order, m := ps.mb, ps.sh, ps.chunks, ps.order[r], ps.m
	n := len(chunks)
	var units []Unit
	builders := map[int]*stageBuilder{}
	stages := l.RankStages(r)
	for _, s := range stages {
		units = append(units, chunks[s]...)
		sb, _, err := newStepBuilder(cfg, l, mb, o, sh, chunks[s])
		if err != nil {
			return Report{}, err
		}
		sb.keep = sb.gathered // weights stay gathered the whole step (see above)
		builders[s] = &stageBuilder{stepBuilder: sb, first: s == 0, lastStage: s == n-1, m: m, megatron: l.PPImpl == job.PPMegatron}
		builders[s].aliasInput()
	}
	rank, saved, err := newStepBuilder(cfg, l, mb, o, sh, units)
	if err != nil {
		return Report{}, err
	}
	rank.keep = rank.gathered
	rank.events = buf
	rank.setup()
	megatron := l.PPImpl == job.PPMegatron
	if !megatron {
		rank.torchRecvBuffers(builders, stages, m)
	}
	var before, after [][]p2pEvent // Megatron's p2p events around each action
	if megatron {
		warm := job.MegatronWarmup(l.PPSchedule, r, l.Stages(), l.VirtualStages(), m)
		before, after = megatronP2P(l.PPSchedule, order, n, warm)
	}
	// Every action appends to the rank's one slice, sized once for the
	// rank's units over all its micro-batches (appending each action's
	// events from a builder's own slice copied the timeline twice over and
	// was a third of a pipeline estimate).
	events := slices.Grow(rank.events, rank.eventsBound(accum*m)+4*len(order)*accum)
	p2p := func(es []p2pEvent, ph Phase, micro int) {
		for _, e := range es {
			tb := builders[e.a.Stage]
			tb.events = events
			tb.p2p(e, ph, micro)
			events = tb.events
		}
	}
	for i, a := range job.PipelineStep([][]job.PipeAction{order}, m, accum)[0] {
		k, micro := i%len(order), a.Accum
		ph := Backward
		if a.Kind == job.PipeF {
			ph = Forward
		}
		if megatron {
			p2p(before[k], ph, micro)
		}
		sb := builders[a.Stage]
		sb.events = events
		sb.micro = micro*m + a.Micro
		switch {
		case a.Kind == job.PipeF:
			sb.forwardStage()
		case a.Kind == job.PipeB, sb.first && a.Kind == job.PipeW:
			sb.backwardStage(a)
		case sb.first: // the first stage's input pass does nothing
		case a.Kind == job.PipeI:
			sb.inputStage()
		default:
			sb.weightStage(a)
		}
		events = sb.events
		if megatron {
			p2p(after[k], ph, micro)
		}
	}
	rank.events = events
	rank.optimizerStep()
	rep := Report{Units: units, State: StateOf(units, l.Sharding, o), Saved: saved, Events: rank.events}
	if o.GradBuffer {
		rep.Events = contiguousGrads(rep.Events, rep.State.Grads)
	}
	rep.Events = withAmaxHistories(o, cfg, l, units, rep.Events)
	return rep, nil
}

// torchRecvBuffers emits, in Setup, the receive buffers PyTorch's
// PipelineStage allocates once per micro-batch for each of the rank's
// stages (see above).
func (rank *stepBuilder) torchRecvBuffers(builders map[int]*stageBuilder, stages []int, m int) {
	for _, s := range stages {
		sb := builders[s]
		rank.phase = Setup
		layer := sb.units[0].Layer
		for i := range m {
			rank.micro = i // one buffer per micro-batch
			if !sb.first {
				rank.allocOn(ComputeStream, layer, labelRecvInput, rank.dx)
			}
			if !sb.lastStage {
				rank.allocOn(ComputeStream, sb.units[len(sb.units)-1].Layer, labelRecvGrad, rank.dx)
			}
		}
	}
}

// stageBuilder emits one pipeline stage's forward and backward actions.
type stageBuilder struct {
	*stepBuilder
	first, lastStage bool // the stage holds the embedding; the head
	m                int  // micro-batches per micro-step
	// megatron: the stage follows Megatron-Core's p2p
	// (pipeline_megatron.go): its receives are allocated and freed around
	// each micro-batch and its output is freed once sent.
	megatron bool
}

// aliasInput drops the saved input of a non-first stage's first unit: it
// is the receive buffer, allocated in Setup.
func (s *stageBuilder) aliasInput() {
	if s.first {
		return
	}
	var keep []moe.SavedRecord
	for _, r := range s.saved[0] {
		if r.Tensor == moe.SavedInput && (r.Op == moe.OpAttnNorm || r.Op == moe.OpFinalNorm) {
			continue
		}
		keep = append(keep, r)
	}
	s.saved[0] = keep
}

func (s *stageBuilder) forwardStage() {
	layers := make([]int, len(s.units))
	for i, u := range s.units {
		layers[i] = u.Layer
	}
	s.forward(job.KeptForward(layers))
	if !s.lastStage {
		s.alloc(s.units[s.last].Layer, labelOutput, s.dx, CatActivations)
	}
}

// backwardStage emits the backward of a micro-batch (a full backward, or
// the first stage's weight pass, which runs its whole backward).
func (s *stageBuilder) backwardStage(a job.PipeStep) {
	s.phase = Backward
	if !s.lastStage && !s.megatron { // Megatron's output was freed once sent
		s.free(s.units[s.last].Layer, labelOutput, s.dx, CatActivations)
	}
	for i := s.last; i >= 0; i-- {
		s.backwardUnitPP(i, a)
	}
	if first := s.units[0]; first.Layer != moe.LayerEmbed {
		s.free(first.Layer, "grad_hidden", s.dx, CatWorkspace) // sent to the previous stage
	}
	if s.megatron {
		s.freeRecvMegatron()
	}
	if a.Reduce {
		s.free(s.units[0].Layer, "reduce_scatter", s.reduceScatterInput(s.units[0]), CatComm)
	}
}

// inputStage emits the backward-input pass of a stage other than the
// first: each unit's recompute, workspace and input gradient, the kept
// output and the sent gradient freed; saved and recomputed tensors stay
// for the weight pass.
func (s *stageBuilder) inputStage() {
	s.phase = Backward
	if !s.lastStage {
		s.free(s.units[s.last].Layer, labelOutput, s.dx, CatActivations)
	}
	for i := s.last; i >= 0; i-- {
		u := s.units[i]
		_, ws := s.backwardOps(i)
		s.cpBackward(i)
		s.alloc(u.Layer, "grad_hidden", s.dx, CatWorkspace)
		if i < s.last {
			s.free(s.units[i+1].Layer, "grad_hidden", s.dx, CatWorkspace)
		}
		s.free(u.Layer, "workspace_bwd", ws, CatWorkspace)
	}
	s.free(s.units[0].Layer, "grad_hidden", s.dx, CatWorkspace) // sent to the previous stage
}

// weightStage emits the backward-weight pass a of a micro-batch on a stage
// other than the first: per unit in reverse, its weight gradients as
// backwardUnitPP accumulates and reduces them, and the frees of what the
// input pass held.
func (s *stageBuilder) weightStage(a job.PipeStep) {
	s.phase = Backward
	for i := s.last; i >= 0; i-- {
		u := s.units[i]
		s.alloc(u.Layer, "unsharded_grads", s.unshardedGrads(u), CatUnshardGrad)
		if !s.isHead(i) && u.Layer >= 0 {
			s.freeRecords(s.recSet(i), CatRecompute)
		}
		s.freeRecords(s.savedSet(i), CatActivations)
		s.accumulatePP(i, a)
	}
	if a.Reduce {
		s.free(s.units[0].Layer, "reduce_scatter", s.reduceScatterInput(s.units[0]), CatComm)
	}
}

// backwardUnitPP is backwardUnit under the pipeline's gradient
// accumulation: the weights stay gathered, the unsharded gradients of
// micro-batch mb are accumulated (allocated in the first micro-batch, in
// the gradient type) and reduced after the last.
func (s *stageBuilder) backwardUnitPP(i int, a job.PipeStep) {
	u := s.units[i]
	rec, ws := s.backwardOps(i)
	s.cpBackward(i)
	if u.Layer != moe.LayerEmbed {
		s.alloc(u.Layer, "grad_hidden", s.dx, CatWorkspace)
	}
	if i < s.last {
		s.free(s.units[i+1].Layer, "grad_hidden", s.dx, CatWorkspace)
	}
	s.alloc(u.Layer, "unsharded_grads", s.unshardedGrads(u), CatUnshardGrad)
	s.free(u.Layer, "workspace_bwd", ws, CatWorkspace)
	s.freeRecords(rec, CatRecompute)
	s.freeRecords(s.savedSet(i), CatActivations)
	s.accumulatePP(i, a)
}

// accumulatePP adds unit i's unsharded gradients of the micro-batch into
// the micro-step's accumulated ones (allocated at the stage's first
// backward of the micro-step) and, after its last (a.Reduce), reduces
// them.
func (s *stageBuilder) accumulatePP(i int, a job.PipeStep) {
	u := s.units[i]
	// Buffers that outlive one micro-batch are labelled with the
	// micro-step's first (accumulated gradients) or, like a step without
	// pipelining, with micro-step 0 (gradients), so that their frees match.
	at := s.micro
	defer func() { s.micro = at }()
	if s.m > 1 {
		s.micro = a.Accum * s.m
		if a.First {
			s.alloc(u.Layer, "accumulated_grads", s.reduceScatterInput(u), CatUnshardGrad)
		}
		s.micro = at
		s.free(u.Layer, "unsharded_grads", s.unshardedGrads(u), CatUnshardGrad)
	}
	if !a.Reduce {
		return
	}
	if i < s.last {
		prev := s.units[i+1]
		s.free(prev.Layer, "reduce_scatter", s.reduceScatterInput(prev), CatComm)
	}
	s.alloc(u.Layer, "reduce_scatter", s.reduceScatterInput(u), CatComm)
	if s.m > 1 {
		s.micro = a.Accum * s.m
		s.free(u.Layer, "accumulated_grads", s.reduceScatterInput(u), CatUnshardGrad)
	} else {
		s.free(u.Layer, "unsharded_grads", s.unshardedGrads(u), CatUnshardGrad)
	}
	if a.Accum == 0 {
		s.micro = 0
		s.emit(true, u.Layer, "gradients", s.gradShard(u), CatGrads, ReduceScatterStream)
	}
}
