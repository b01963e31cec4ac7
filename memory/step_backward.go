package memory

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// backward emits micro-step m's backward, walking the step's order bw (the
// units' phases in the order they run, the last unit first): each unit's
// backwardUnit, then the free of the logits a trainer held
// (freeHeldLogits) and of the last reduce-scatter input, that of the first
// unit. The first micro-step also allocates the partial reduce
// buffer.
func (s *stepBuilder) backward(m int, bw []job.StepPhase) {
	s.phase = Backward
	if m == 0 && s.partial > 0 {
		s.emit(true, moe.LayerEmbed, "partial_reduce", s.partial, CatGrads, ReduceScatterStream)
	}
	for k, ph := range bw {
		var next *job.StepPhase
		if k+1 < len(bw) {
			next = &bw[k+1]
		}
		s.backwardUnit(s.last-k, m, ph, next)
	}
	s.freeHeldLogits()
	if s.reduces(m) {
		first := s.units[0]
		s.free(first.Layer, "reduce_scatter", s.reduceScatterInput(first), CatComm)
	}
}

// backwardUnit emits unit i's backward in micro-step m, its phase ph (next:
// the phase of the unit whose backward follows, nil for the last): its
// weights (gatherBackward), its compute (backwardOps), its input gradient,
// which replaces unit i+1's, its weight gradients, the frees of what the
// compute read, the gradients' reduction (reduceGradients) and the free of
// its weights where the phase says. Under grad-sync-last-only, micro-steps
// before the last accumulate instead (accumulateGrads), and the last adds
// its gradients into the accumulated ones, which it reduces.
func (s *stepBuilder) backwardUnit(i, m int, ph job.StepPhase, next *job.StepPhase) {
	u := s.units[i]
	s.gatherBackward(i, ph, next)
	rec, ws := s.backwardOps(i)
	s.cpBackward(i)
	if u.Layer != moe.LayerEmbed {
		s.alloc(u.Layer, "grad_hidden", s.dx, CatWorkspace)
	}
	if i < s.last {
		s.free(s.units[i+1].Layer, "grad_hidden", s.dx, CatWorkspace)
	}
	glabel := "unsharded_grads"
	if s.syncLast && m == 0 && !s.accumUpcast() {
		glabel = "accumulated_grads" // autograd's gradient is the accumulator
	}
	s.alloc(u.Layer, glabel, s.unshardedGrads(u), CatUnshardGrad)
	s.free(u.Layer, "workspace_bwd", ws, CatWorkspace)
	s.freeRecords(rec, CatRecompute)
	s.freeRecords(s.savedSet(i), CatActivations)
	switch {
	case !s.syncLast:
		s.reduceGradients(i, m, func() { s.free(u.Layer, "unsharded_grads", s.unshardedGrads(u), CatUnshardGrad) })
	case !ph.Reduce:
		s.accumulateGrads(i, m, ph)
		return
	default:
		s.free(u.Layer, "unsharded_grads", s.unshardedGrads(u), CatUnshardGrad) // added into the accumulator
		s.reduceGradients(i, m, func() {
			s.emitAt(0, false, u.Layer, "accumulated_grads", s.accumulatedGrads(u), CatUnshardGrad, ComputeStream)
		})
	}
	if ph.Free && s.gathered {
		s.freeWeights(i)
	}
}

// accumulateGrads emits unit i's post-backward in a micro-step m that does
// not reduce (grad-sync-last-only, before the last), in FSDP2's order
// (FSDPParamGroup.post_backward with reduce_grads false): after the first
// micro-step autograd's gradient is added into the accumulated one and
// freed; the weights are resharded (unless keep-gathered); in the first
// micro-step, when the reduce type differs from the compute type, the
// gradient is upcast into the accumulator and the original freed.
func (s *stepBuilder) accumulateGrads(i, m int, ph job.StepPhase) {
	u := s.units[i]
	if m > 0 {
		s.free(u.Layer, "unsharded_grads", s.unshardedGrads(u), CatUnshardGrad)
	}
	if ph.Free && s.gathered {
		s.freeWeights(i)
	}
	if m == 0 && s.accumUpcast() {
		s.alloc(u.Layer, "accumulated_grads", s.accumulatedGrads(u), CatUnshardGrad)
		s.free(u.Layer, "unsharded_grads", s.unshardedGrads(u), CatUnshardGrad)
	}
}

// gatherBackward emits the re-gather of unit i's weights when its phase ph
// gathers them (its forward freed them; the buffer was prefetched, or the
// unit gathers its own when its backward runs first), and the prefetch of
// the next unit's (phase next) when that one gathers too. The weights are
// labelled "weights_bwd".
func (s *stepBuilder) gatherBackward(i int, ph job.StepPhase, next *job.StepPhase) {
	u := s.units[i]
	if ph.Gather && s.fsdp {
		if i == s.last {
			s.allocOn(AllGatherStream, u.Layer, "allgather_bwd", s.weights(u))
		}
		s.allocWeights(i, "weights_bwd")
		s.freeOn(AllGatherStream, u.Layer, "allgather_bwd", s.weights(u))
	}
	if s.fsdp && next != nil && next.Gather {
		prev := s.units[i-1]
		s.allocOn(AllGatherStream, prev.Layer, "allgather_bwd", s.weights(prev)) // prefetch
	}
}

// backwardOps emits the compute of unit i's backward: the head's loss
// gradients, or a block's recomputed tensors, its workspace (twice the
// largest intermediate) and all-to-all buffers. It returns the recomputed
// records and the workspace bytes, which backwardUnit frees once the
// weight gradients exist.
func (s *stepBuilder) backwardOps(i int) (rec *recordSet, ws int64) {
	u := s.units[i]
	switch {
	case s.isHead(i):
		s.lossBackward(u.Layer)
	case u.Layer >= 0:
		rec = s.recSet(i)
		s.allocRecords(rec, CatRecompute)
		ws = 2 * largest(s.none[i])
		s.alloc(u.Layer, "workspace_bwd", ws, CatWorkspace)
		if s.cfg.MoELayer[u.Layer] {
			s.alloc(u.Layer, "a2a_combine_bwd", s.a2a, CatComm)
			s.free(u.Layer, "a2a_combine_bwd", s.a2a, CatComm)
			s.alloc(u.Layer, "a2a_dispatch_bwd", s.a2a, CatComm)
			s.free(u.Layer, "a2a_dispatch_bwd", s.a2a, CatComm)
		}
	}
	return rec, ws
}

// reduceGradients emits the reduction of unit i's weight gradients in
// micro-step m. Unit i+1's reduce-scatter ran while unit i computed, so its
// input is freed first. FSDP2 (torch ≥ 2.6 foreach_reduce) copies the
// gradients into the reduce-scatter input on the compute stream, which
// frees the unsharded gradients (freeGrads), and allocates the output,
// which becomes the gradient, on the reduce-scatter stream: once, in the
// first micro-step that reduces, later ones accumulating into it.
func (s *stepBuilder) reduceGradients(i, m int, freeGrads func()) {
	u := s.units[i]
	if i < s.last {
		prev := s.units[i+1]
		s.free(prev.Layer, "reduce_scatter", s.reduceScatterInput(prev), CatComm)
	}
	s.alloc(u.Layer, "reduce_scatter", s.reduceScatterInput(u), CatComm)
	freeGrads()
	if m == s.firstReduce {
		s.emit(true, u.Layer, "gradients", s.gradShard(u), CatGrads, ReduceScatterStream)
	}
}
