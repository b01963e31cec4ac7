package memory

import (
	"fmt"
	"iter"
	"slices"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// stepBuilder emits the events of one training step (see the package doc
// for their order). newStepBuilder derives, once, what the phases read.
type stepBuilder struct {
	cfg   *moe.Config
	l     job.Layout
	o     Options
	sh    Shape
	units []Unit
	last  int // index of the head, the last unit
	// saved holds per unit the tensors kept under the policy, the head's
	// without those lossSaved holds (the unchunked loss's own, allocated
	// inside the logits' lifetime); none the tensors kept without
	// checkpointing, of which backward recomputes what saved lacks.
	saved     [][]moe.SavedRecord
	none      [][]moe.SavedRecord
	lossSaved []moe.SavedRecord
	fsdp      bool
	// gathered: a unit's compute weights are a separate allocation (FSDP
	// all-gather, or an autocast copy when compute and storage types differ).
	gathered bool
	keep     bool // FSDP with keep-gathered: weights live the whole step
	// resharded holds per unit whether its weights are freed after its
	// forward (reshard-after-forward, which torchtitan does not apply to
	// the last block and the head).
	resharded []bool
	// partial is the bytes of the partial reduce buffer that
	// allreduce-last-only keeps across micro-steps (0 when it keeps none).
	partial int64
	T, V    int64 // tokens per micro-step, vocabulary
	dx      int64 // bytes of one input gradient (T×D, activation type)
	a2a     int64 // bytes of one all-to-all buffer (0 without ep)
	events  []Event
	phase   Phase
	micro   int

	// syncLast: grad-sync-last-only with accumulation; gradients are
	// reduced only in micro-step firstReduce (the last), accumulated
	// unsharded before. firstReduce is 0 otherwise: the micro-step that
	// allocates the reduced gradients.
	syncLast    bool
	firstReduce int

	// Record labels ("saved attn_norm input", …) built once per unit and
	// reused by every micro-step and micro-batch: building them per event
	// was a fifth of a planner's memory estimates. Filled on first use, so
	// after a pipeline stage's aliasInput has edited saved.
	savedSets, recSets []*recordSet
	lossSet            *recordSet
	labelOf            map[[3]string]string
}

// recordSet is records with the label each one's events carry.
type recordSet struct {
	rs     []moe.SavedRecord
	labels []string
}

// labelled labels rs with prefix; the labels name no layer, so one
// string serves every unit (interned in s.labelOf).
func (s *stepBuilder) labelled(prefix string, rs []moe.SavedRecord) *recordSet {
	set := &recordSet{rs: rs, labels: make([]string, len(rs))}
	if s.labelOf == nil {
		s.labelOf = map[[3]string]string{}
	}
	for k, r := range rs {
		key := [3]string{prefix, string(r.Op), r.Tensor}
		l, ok := s.labelOf[key]
		if !ok {
			l = prefix + " " + string(r.Op) + " " + r.Tensor
			s.labelOf[key] = l
		}
		set.labels[k] = l
	}
	return set
}

// savedSet is unit i's saved records labelled "saved".
func (s *stepBuilder) savedSet(i int) *recordSet {
	if s.savedSets == nil {
		s.savedSets = make([]*recordSet, len(s.units))
	}
	if s.savedSets[i] == nil {
		s.savedSets[i] = s.labelled("saved", s.saved[i])
	}
	return s.savedSets[i]
}

// recSet is what block unit i's backward recomputes (missing), labelled
// "recompute".
func (s *stepBuilder) recSet(i int) *recordSet {
	if s.recSets == nil {
		s.recSets = make([]*recordSet, len(s.units))
	}
	if s.recSets[i] == nil {
		s.recSets[i] = s.labelled("recompute", missing(s.none[i], s.saved[i]))
	}
	return s.recSets[i]
}

// lossSavedSet is the loss's own saved records labelled "saved".
func (s *stepBuilder) lossSavedSet() *recordSet {
	if s.lossSet == nil {
		s.lossSet = s.labelled("saved", s.lossSaved)
	}
	return s.lossSet
}

func (s *stepBuilder) emit(alloc bool, layer int, label string, bytes int64, c Category, st Stream) {
	if bytes <= 0 {
		return
	}
	s.events = append(s.events, Event{Phase: s.phase, Micro: s.micro, Layer: layer, Label: label,
		Alloc: alloc, Bytes: bytes, Category: c, Stream: st})
}

func (s *stepBuilder) alloc(layer int, label string, n int64, c Category) {
	s.emit(true, layer, label, n, c, ComputeStream)
}

func (s *stepBuilder) free(layer int, label string, n int64, c Category) {
	s.emit(false, layer, label, n, c, ComputeStream)
}

func (s *stepBuilder) allocOn(st Stream, layer int, label string, n int64) {
	s.emit(true, layer, label, n, CatComm, st)
}

func (s *stepBuilder) freeOn(st Stream, layer int, label string, n int64) {
	s.emit(false, layer, label, n, CatComm, st)
}

// allocRecords allocates one tensor per record of set (labelled prefix,
// op, tensor; nil allocates nothing).
func (s *stepBuilder) allocRecords(set *recordSet, c Category) {
	if set == nil {
		return
	}
	for k, r := range set.rs {
		s.alloc(r.Layer, set.labels[k], r.Bytes(), c)
	}
}

func (s *stepBuilder) freeRecords(set *recordSet, c Category) {
	if set == nil {
		return
	}
	for k, r := range set.rs {
		s.free(r.Layer, set.labels[k], r.Bytes(), c)
	}
}

// missing returns the records of none that saved lacks (by op and tensor):
// what backward rebuilds by recomputation.
func missing(none, saved []moe.SavedRecord) []moe.SavedRecord {
	var out []moe.SavedRecord
	for _, r := range none {
		// A unit keeps tens of records: a scan is cheaper than a set.
		if !slices.ContainsFunc(saved, func(x moe.SavedRecord) bool { return x.Op == r.Op && x.Tensor == r.Tensor }) {
			out = append(out, r)
		}
	}
	return out
}

// newStepBuilder reads the saved tensors of every unit and derives the
// layout's choices and the buffer sizes. It returns the saved bytes per unit
// too.
func newStepBuilder(cfg *moe.Config, l job.Layout, b Batch, o Options, sh Shape, units []Unit) (*stepBuilder, []int64, error) {
	p := o.Precision
	fsdp := l.Sharding == job.ShardFSDP
	s := &stepBuilder{cfg: cfg, l: l, o: o, sh: sh, units: units, last: len(units) - 1,
		fsdp: fsdp, gathered: fsdp || p.Compute != p.Param, keep: fsdp && l.KeepGathered,
		T: int64(sh.Batch) * int64(sh.Seq), V: int64(cfg.Vocab)}
	savedBytes, err := s.loadSaved()
	if err != nil {
		return nil, nil, err
	}
	s.resharded = make([]bool, len(units))
	for i, u := range units {
		s.resharded[i] = fsdp && !s.keep && l.ReshardAfterForward && u.Layer != cfg.LayerHead() && u.Layer != cfg.Layers-1
	}
	if l.GradSyncLastOnly && b.GradAccum > 1 {
		s.syncLast, s.firstReduce = true, b.GradAccum-1
	}
	// Under grad-sync-last-only nothing is reduce-scattered before the last
	// micro-step, so there is no partial reduce output to keep.
	if l.AllreduceLastOnly && l.DPReplicate > 1 && b.GradAccum > 1 && !s.syncLast {
		for _, u := range units {
			s.partial += s.gradShard(u)
		}
	}
	act := p.Activation.Bytes()
	D := int64(cfg.Hidden)
	// Under tp the blocks' input gradients are in the sequence-parallel
	// region (T/tp tokens), a tp rank's logits hold ⌈V/tp⌉ of the
	// vocabulary (loss parallel), and its all-to-alls the routed rows it
	// owns (Layout.TokensPerExpertRank); T divides by tp (Layout.CheckSeq).
	tp := int64(l.TPDegree())
	s.dx = s.T / tp * D * act
	s.V = chunk(s.V, tp)
	if l.EP > 1 {
		s.a2a = s.T * int64(cfg.TopK) / int64(l.TokensPerExpertRank()) * D * act
	}
	return s, savedBytes, nil
}

// loadSaved fills saved, none and lossSaved and returns the saved bytes per
// unit.
func (s *stepBuilder) loadSaved() ([]int64, error) {
	savedBytes := make([]int64, len(s.units))
	noneShape := s.sh
	noneShape.AC = moe.AC{Mode: moe.ACNone}
	// A block's tables depend on its index only through whether it is a
	// MoE block and whether the policy checkpoints it fully (Saved,
	// moe.SavedTensors, compiledBlock, tpSaved read nothing else of the
	// layer; TestLoadSavedPerLayer checks it on random configs), so one
	// block of each kind is computed and the others take its records.
	type kind struct{ moe, full bool }
	kinds := map[kind][2][]moe.SavedRecord{}
	for i, u := range s.units {
		k := kind{}
		block := u.Layer >= 0 && u.Layer < s.cfg.Layers
		if block {
			k = kind{s.cfg.MoELayer[u.Layer], s.sh.AC.FullyCheckpointed(u.Layer)}
		}
		var rs, rn []moe.SavedRecord
		if got, ok := kinds[k]; ok && block {
			rs, rn = atLayer(got[0], u.Layer), atLayer(got[1], u.Layer)
		} else {
			var err error
			if rs, err = Saved(s.cfg, u.Layer, s.sh); err != nil {
				return nil, err
			}
			if rn, err = Saved(s.cfg, u.Layer, noneShape); err != nil {
				return nil, err
			}
			if block {
				kinds[k] = [2][]moe.SavedRecord{rs, rn}
			}
		}
		if u.Layer == s.cfg.LayerHead() && s.o.LossChunks > 1 {
			rs = withoutLogProbs(rs)
		}
		s.saved = append(s.saved, rs)
		s.none = append(s.none, rn)
		savedBytes[i] = SavedBytes(rs)
	}
	// Unchunked, the loss's own saved tensors are allocated by lossForward
	// inside the logits' lifetime; the rest of the head's (and, chunked,
	// the labels the chunks' checkpoints hold) with the head's forward.
	var head []moe.SavedRecord
	for _, r := range s.saved[s.last] {
		if r.Op == moe.OpLoss && s.o.LossChunks <= 1 {
			s.lossSaved = append(s.lossSaved, r)
		} else {
			head = append(head, r)
		}
	}
	s.saved[s.last] = head
	return savedBytes, nil
}

// atLayer is a copy of rs with every record's layer set to layer.
func atLayer(rs []moe.SavedRecord, layer int) []moe.SavedRecord {
	out := slices.Clone(rs)
	for k := range out {
		out[k].Layer = layer
	}
	return out
}

// isHead reports whether unit i is the head (the last unit, except on a
// pipeline stage that does not hold it).
func (s *stepBuilder) isHead(i int) bool { return s.units[i].Layer == s.cfg.LayerHead() }

// weights is the bytes of unit u's compute weights.
func (s *stepBuilder) weights(u Unit) int64 { return u.Local * s.o.Precision.Compute.Bytes() }

// gradShard is the bytes of unit u's reduced gradient: sharded under fsdp
// and zero2, whole otherwise.
func (s *stepBuilder) gradShard(u Unit) int64 {
	if s.l.Sharding == job.ShardFSDP || s.l.Sharding == job.ShardZeRO2 {
		return u.Shard * s.o.Precision.Grad.Bytes()
	}
	return u.Local * s.o.Precision.Grad.Bytes()
}

// unshardedGrads is the bytes of unit u's weight gradients before their
// reduction: its local elements in the compute type.
func (s *stepBuilder) unshardedGrads(u Unit) int64 { return u.Local * s.o.Precision.Compute.Bytes() }

// reduceScatterInput is the bytes of unit u's reduce-scatter input: its
// whole local gradient in the reduce type (foreach_reduce allocates it in
// reduce_dtype).
func (s *stepBuilder) reduceScatterInput(u Unit) int64 { return u.Local * s.o.ReduceDType.Bytes() }

// accumulatedGrads is the bytes of unit u's unsharded gradients kept
// across micro-steps under grad-sync-last-only: its local elements in the
// reduce type. When that differs from the compute type, FSDP2 upcasts
// autograd's gradient into a new tensor (to_accumulated_grad_if_needed);
// when equal, autograd's gradient itself is kept, the same bytes.
func (s *stepBuilder) accumulatedGrads(u Unit) int64 { return u.Local * s.o.ReduceDType.Bytes() }

// accumUpcast reports whether the accumulated gradients are a copy in
// another type than autograd's (reduce type ≠ compute type).
func (s *stepBuilder) accumUpcast() bool { return s.o.ReduceDType != s.o.Precision.Compute }

// reduces reports whether micro-step m reduces gradients: every one, or
// under grad-sync-last-only only the last.
func (s *stepBuilder) reduces(m int) bool { return !s.syncLast || m == s.firstReduce }

// emitAt emits an event of micro-step m from inside another one: the free
// of a buffer allocated in an earlier micro-step names that micro-step.
func (s *stepBuilder) emitAt(m int, alloc bool, layer int, label string, bytes int64, c Category, st Stream) {
	cur := s.micro
	s.micro = m
	s.emit(alloc, layer, label, bytes, c, st)
	s.micro = cur
}

// buildTimeline returns the events of one step and the saved bytes per unit.
func buildTimeline(cfg *moe.Config, l job.Layout, b Batch, o Options, sh Shape, units []Unit) ([]Event, []int64, error) {
	s, savedBytes, err := newStepBuilder(cfg, l, b, o, sh, units)
	if err != nil {
		return nil, nil, err
	}
	s.events = make([]Event, 0, s.eventsBound(b.GradAccum))
	s.setup()
	for m := 0; m < b.GradAccum; m++ {
		s.micro = m
		s.forward()
		s.backward(m)
	}
	if s.partial > 0 {
		// The partial reduce buffer lives until the last micro-step's
		// backward ends; it was allocated in the first one's.
		s.phase, s.micro = Backward, 0
		s.emit(false, moe.LayerEmbed, "partial_reduce", s.partial, CatGrads, ReduceScatterStream)
	}
	s.optimizerStep()
	return s.events, savedBytes, nil
}

// eventsBound is a generous count of the step's events, to size the slice
// once: per micro-step each saved or recomputed record is allocated and
// freed, each unit emits at most about 30 buffer events, plus the loss's
// chunks; setup and optimizer a few per unit.
func (s *stepBuilder) eventsBound(micro int) int {
	records := 0
	for i := range s.units {
		records += len(s.saved[i]) + len(s.none[i])
	}
	perMicro := 2*records + 30*len(s.units) + 16*max(1, s.o.LossChunks)
	return 8*len(s.units) + micro*perMicro
}

// setup emits what is live when the step begins. Per unit, as StateOf sums
// them: stored parameters (and buffers), then each AdamW moment (and the
// master copy) per unit; with keep-gathered, every unit's gathered weights.
func (s *stepBuilder) setup() {
	s.phase, s.micro = Setup, -1
	for _, u := range s.units {
		us := StateOf([]Unit{u}, s.l.Sharding, s.o)
		s.alloc(u.Layer, "parameters", us.Params, CatParams)
	}
	for _, u := range s.units {
		us := StateOf([]Unit{u}, s.l.Sharding, s.o)
		s.alloc(u.Layer, "optimizer_state", us.Optimizer, CatOptimizer)
	}
	if s.keep {
		for _, u := range s.units {
			s.alloc(u.Layer, "weights", s.weights(u), CatWeights)
		}
	}
}

// forward emits one micro-step's forward, units in order: per unit its
// weights (gatherForward), its saved tensors, the head's loss or a block's
// transient buffers, and resharding.
func (s *stepBuilder) forward() {
	s.phase = Forward
	for i, u := range s.units {
		s.gatherForward(i)
		s.allocRecords(s.savedSet(i), CatActivations)
		switch {
		case s.isHead(i):
			s.lossForward(u.Layer)
		case u.Layer >= 0:
			s.blockForward(i)
		}
		if s.resharded[i] {
			s.free(u.Layer, "weights", s.weights(u), CatWeights)
		}
	}
}

// gatherForward emits unit i's compute weights for its forward. Under FSDP
// (not keep-gathered): the copy-out of its all-gather, whose buffer the
// previous unit prefetched (the first unit gathers its own), and the
// prefetch of unit i+1's. Otherwise, when compute and storage types
// differ, the cast copy.
func (s *stepBuilder) gatherForward(i int) {
	u := s.units[i]
	w := s.weights(u)
	switch {
	case s.fsdp && !s.keep:
		if i == 0 {
			s.allocOn(AllGatherStream, u.Layer, "allgather", w)
		}
		// Copy-out of the all-gather into the unsharded parameters.
		s.alloc(u.Layer, "weights", w, CatWeights)
		s.freeOn(AllGatherStream, u.Layer, "allgather", w)
		if i+1 < len(s.units) {
			next := s.units[i+1]
			s.allocOn(AllGatherStream, next.Layer, "allgather", s.weights(next)) // prefetch
		}
	case !s.fsdp && s.gathered && !s.keep: // kept: allocated in setup (pipeline stages)
		s.alloc(u.Layer, "weights", w, CatWeights)
	}
}

// blockForward emits the transient buffers of block unit i's forward: its
// workspace (the largest intermediate) and, on MoE blocks, the all-to-all
// buffers.
func (s *stepBuilder) blockForward(i int) {
	layer := s.units[i].Layer
	ws := largest(s.none[i])
	s.alloc(layer, "workspace", ws, CatWorkspace)
	if s.cfg.MoELayer[layer] {
		// All-to-all send buffers, on the compute stream
		// (torchtitan's all_to_all_single runs there).
		s.alloc(layer, "a2a_dispatch", s.a2a, CatComm)
		s.free(layer, "a2a_dispatch", s.a2a, CatComm)
		s.alloc(layer, "a2a_combine", s.a2a, CatComm)
		s.free(layer, "a2a_combine", s.a2a, CatComm)
	}
	s.free(layer, "workspace", ws, CatWorkspace)
}

// backward emits micro-step m's backward, units in reverse (backwardUnit),
// then the free of the last reduce-scatter input, that of the first unit.
// The first micro-step also allocates the partial reduce buffer.
func (s *stepBuilder) backward(m int) {
	s.phase = Backward
	if m == 0 && s.partial > 0 {
		s.emit(true, moe.LayerEmbed, "partial_reduce", s.partial, CatGrads, ReduceScatterStream)
	}
	for i := s.last; i >= 0; i-- {
		s.backwardUnit(i, m)
	}
	if s.reduces(m) {
		first := s.units[0]
		s.free(first.Layer, "reduce_scatter", s.reduceScatterInput(first), CatComm)
	}
}

// backwardUnit emits unit i's backward in micro-step m: its weights
// (gatherBackward), its compute (backwardOps), its input gradient, which
// replaces unit i+1's, its weight gradients, the frees of what the compute
// read, the gradients' reduction (reduceGradients) and resharding. Under
// grad-sync-last-only, micro-steps before the last accumulate instead
// (accumulateGrads), and the last adds its gradients into the accumulated
// ones, which it reduces.
func (s *stepBuilder) backwardUnit(i, m int) {
	u := s.units[i]
	wlabel := s.gatherBackward(i)
	rec, ws := s.backwardOps(i)
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
	case m < s.firstReduce:
		s.accumulateGrads(i, m, wlabel)
		return
	default:
		s.free(u.Layer, "unsharded_grads", s.unshardedGrads(u), CatUnshardGrad) // added into the accumulator
		s.reduceGradients(i, m, func() {
			s.emitAt(0, false, u.Layer, "accumulated_grads", s.accumulatedGrads(u), CatUnshardGrad, ComputeStream)
		})
	}
	if s.gathered && !s.keep {
		s.free(u.Layer, wlabel, s.weights(u), CatWeights)
	}
}

// accumulateGrads emits unit i's post-backward in a micro-step m that does
// not reduce (grad-sync-last-only, before the last), in FSDP2's order
// (FSDPParamGroup.post_backward with reduce_grads false): after the first
// micro-step autograd's gradient is added into the accumulated one and
// freed; the weights are resharded (unless keep-gathered); in the first
// micro-step, when the reduce type differs from the compute type, the
// gradient is upcast into the accumulator and the original freed.
func (s *stepBuilder) accumulateGrads(i, m int, wlabel string) {
	u := s.units[i]
	if m > 0 {
		s.free(u.Layer, "unsharded_grads", s.unshardedGrads(u), CatUnshardGrad)
	}
	if s.gathered && !s.keep {
		s.free(u.Layer, wlabel, s.weights(u), CatWeights)
	}
	if m == 0 && s.accumUpcast() {
		s.alloc(u.Layer, "accumulated_grads", s.accumulatedGrads(u), CatUnshardGrad)
		s.free(u.Layer, "unsharded_grads", s.unshardedGrads(u), CatUnshardGrad)
	}
}

// gatherBackward emits the re-gather of unit i's weights when its forward
// resharded them (the buffer was prefetched) and the prefetch of unit i-1's
// when that one was resharded. It returns the label unit i's weights are
// freed under.
func (s *stepBuilder) gatherBackward(i int) string {
	u := s.units[i]
	wlabel := "weights"
	if s.resharded[i] {
		wlabel = "weights_bwd"
		s.alloc(u.Layer, wlabel, s.weights(u), CatWeights)
		s.freeOn(AllGatherStream, u.Layer, "allgather_bwd", s.weights(u))
	}
	if i > 0 && s.resharded[i-1] {
		prev := s.units[i-1]
		s.allocOn(AllGatherStream, prev.Layer, "allgather_bwd", s.weights(prev)) // prefetch
	}
	return wlabel
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

// optimizerStep emits the optimizer's events. Foreach AdamW materializes
// sqrt(v) for every local element at once, one tensor per parameter (here:
// per unit), then frees them; the fused implementation updates in place.
// Then zero_grad(set_to_none=True) releases the gradients.
func (s *stepBuilder) optimizerStep() {
	s.phase, s.micro = Optimizer, -1
	optTemp := func(u Unit) int64 {
		if s.l.Sharding == job.ShardDDP {
			return u.Local * s.o.Precision.Optimizer.Bytes()
		}
		return u.Shard * s.o.Precision.Optimizer.Bytes()
	}
	if s.o.OptimizerImpl == Foreach {
		for _, u := range s.units {
			s.alloc(u.Layer, "adamw_sqrt_v", optTemp(u), CatOptTemp)
		}
		for _, u := range s.units {
			s.free(u.Layer, "adamw_sqrt_v", optTemp(u), CatOptTemp)
		}
	}
	s.micro = s.firstReduce
	for _, u := range s.units {
		s.emit(false, u.Layer, "gradients", s.gradShard(u), CatGrads, ReduceScatterStream)
	}
}

// withoutLogProbs drops the loss's vocabulary-sized records (the
// log-probabilities, or a compiled loss's logits and log-sum-exp): a
// chunked loss checkpoints each chunk and recomputes them in backward. The
// labels stay, held by the chunks' checkpoints as their inputs as nll_loss
// holds them unchunked.
func withoutLogProbs(rs []moe.SavedRecord) []moe.SavedRecord {
	var out []moe.SavedRecord
	for _, r := range rs {
		if r.Op != moe.OpLoss || r.Tensor == "labels" {
			out = append(out, r)
		}
	}
	return out
}

// lossChunks yields the label suffix and token count of each chunk of the
// chunked loss: ⌈T/c⌉ tokens each, the last one shorter (torch.chunk's
// split, which may give fewer than c chunks).
func (s *stepBuilder) lossChunks() iter.Seq2[string, int64] {
	return func(yield func(string, int64) bool) {
		T, c := s.T, int64(s.o.LossChunks)
		tc := (T + c - 1) / c
		for k := int64(0); k < c && k*tc < T; k++ {
			if !yield(fmt.Sprintf(" chunk %d", k), min(tc, T-k*tc)) {
				return
			}
		}
	}
}

// lossBytes is the size of one element of the eager loss's tensors.
func (s *stepBuilder) lossBytes() int64 { return s.sh.LossDType.Bytes() }

// upcast reports whether the eager loss copies the logits into another
// type first (torchtitan's pred.float()).
func (s *stepBuilder) upcast() bool { return s.sh.LossDType != s.o.Precision.Activation }

// logProbs emits the eager loss's forward over n = tokens × V elements: the
// LM head's logits (activation type), their copy in the loss type when it
// upcasts, and the log-probabilities computed from it (keep allocates
// them), then the frees of the copy and of the logits (torchtitan's `del
// pred`). suffix ends each label.
func (s *stepBuilder) logProbs(layer int, suffix string, n int64, keep func()) {
	act := s.o.Precision.Activation.Bytes()
	s.alloc(layer, "logits"+suffix, n*act, CatLoss)
	if s.upcast() {
		s.alloc(layer, "logits_f32"+suffix, n*s.lossBytes(), CatLoss)
	}
	keep()
	if s.upcast() {
		s.free(layer, "logits_f32"+suffix, n*s.lossBytes(), CatLoss)
	}
	s.free(layer, "logits"+suffix, n*act, CatLoss)
}

// lossForward emits the head's logits and cross-entropy. Eager (logProbs)
// the log-probabilities are saved; compiled, the logits themselves (with
// the log-sum-exp: Saved's compiled table) are what the loss keeps, so
// nothing else vocabulary-sized is allocated. With LossChunks > 1 each
// chunk does the same and frees what it kept (the chunk is checkpointed
// and recomputed in backward).
func (s *stepBuilder) lossForward(layer int) {
	act := s.o.Precision.Activation.Bytes()
	if s.o.LossChunks <= 1 {
		if s.sh.Compile.Loss {
			s.allocRecords(s.lossSavedSet(), CatActivations)
			return
		}
		s.logProbs(layer, "", s.T*s.V, func() { s.allocRecords(s.lossSavedSet(), CatActivations) })
		return
	}
	for l, tokens := range s.lossChunks() {
		n := tokens * s.V
		if s.sh.Compile.Loss {
			s.alloc(layer, "logits"+l, n*act, CatLoss)
			s.free(layer, "logits"+l, n*act, CatLoss)
			continue
		}
		s.logProbs(layer, l, n, func() { s.alloc(layer, "log_probs"+l, n*s.lossBytes(), CatLoss) })
		s.free(layer, "log_probs"+l, n*s.lossBytes(), CatLoss)
	}
}

// lossBackward emits the gradients of the loss (lossGrads, or compiled
// lossGradsCompiled). Chunked, each chunk first recomputes its forward.
func (s *stepBuilder) lossBackward(layer int) {
	act := s.o.Precision.Activation.Bytes()
	if s.o.LossChunks <= 1 {
		free := func() { s.freeRecords(s.lossSavedSet(), CatActivations) }
		if s.sh.Compile.Loss {
			s.lossGradsCompiled(layer, "", s.T*s.V, free)
			return
		}
		s.lossGrads(layer, "", s.T*s.V, free)
		return
	}
	for l, tokens := range s.lossChunks() {
		n := tokens * s.V
		if s.sh.Compile.Loss {
			s.alloc(layer, "logits_bwd"+l, n*act, CatLoss)
			s.lossGradsCompiled(layer, l, n, func() { s.free(layer, "logits_bwd"+l, n*act, CatLoss) })
			continue
		}
		s.logProbs(layer, "_bwd"+l, n, func() { s.alloc(layer, "log_probs_bwd"+l, n*s.lossBytes(), CatLoss) })
		s.lossGrads(layer, l, n, func() { s.free(layer, "log_probs_bwd"+l, n*s.lossBytes(), CatLoss) })
	}
}

// lossGrads emits, for n = tokens × V elements, nll_loss's gradient and
// log_softmax's input gradient (both in the loss type), the free of the
// log-probabilities (freeLogProbs: backward has read them) and, when the
// loss upcast, the cast of the gradient to the activation type for the LM
// head.
func (s *stepBuilder) lossGrads(layer int, suffix string, n int64, freeLogProbs func()) {
	act, lb := s.o.Precision.Activation.Bytes(), s.lossBytes()
	grad := "grad_logits" + suffix
	if s.upcast() {
		grad = "grad_logits_f32" + suffix
	}
	s.alloc(layer, "grad_log_probs"+suffix, n*lb, CatLoss)
	s.alloc(layer, grad, n*lb, CatLoss)
	s.free(layer, "grad_log_probs"+suffix, n*lb, CatLoss)
	freeLogProbs()
	if s.upcast() {
		s.alloc(layer, "grad_logits"+suffix, n*act, CatLoss)
		s.free(layer, grad, n*lb, CatLoss)
		s.free(layer, "grad_logits"+suffix, n*act, CatLoss)
		return
	}
	s.free(layer, grad, n*lb, CatLoss)
}

// lossGradsCompiled emits a compiled loss's backward over n elements: one
// fused kernel writes the logits' gradient in the activation type while the
// saved logits are live; then they are freed (freeSaved), and the gradient
// once the LM head's backward has read it.
func (s *stepBuilder) lossGradsCompiled(layer int, suffix string, n int64, freeSaved func()) {
	act := s.o.Precision.Activation.Bytes()
	s.alloc(layer, "grad_logits"+suffix, n*act, CatLoss)
	freeSaved()
	s.free(layer, "grad_logits"+suffix, n*act, CatLoss)
}
