package memory

import (
	"slices"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// stepBuilder emits the events of one training step (see the package doc
// for their order). newStepBuilder derives, once, what the phases read.
// Setup and the optimizer step are here; the forward (step_forward.go),
// the backward (step_backward.go) and the loss (step_loss.go) are beside
// it, with the emitting of events and labelled records (step_events.go).
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
	// keep: the weights are allocated in setup and live the whole step (a
	// pipeline stage's); otherwise the step's order says when each unit's
	// are gathered and freed.
	keep  bool
	order job.StepOrder
	// wlive holds per unit the allocation of its live weights: labelled
	// "weights", or "weights_bwd" when gathered for a backward.
	wlive []liveWeights
	// partial is the bytes of the partial reduce buffer that
	// allreduce-last-only keeps across micro-steps (0 when it keeps none).
	partial int64
	T, V    int64 // tokens per micro-step, vocabulary
	dx      int64 // bytes of one input gradient (T×D, activation type)
	// cpFwd and cpBwd are the K/V exchange buffers a block's attention
	// holds under context parallelism, forward and backward (cpBuffers).
	cpFwd, cpBwd int64
	a2a          int64 // bytes of one all-to-all buffer (0 without ep)
	events       []Event
	phase        Phase
	micro        int

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

// newStepBuilder reads the saved tensors of every unit and derives the
// layout's choices and the buffer sizes. It returns the saved bytes per unit
// too.
func newStepBuilder(cfg *moe.Config, l job.Layout, b Batch, o Options, sh Shape, units []Unit) (*stepBuilder, []int64, error) {
	p := o.Precision
	fsdp := l.Sharding == job.ShardFSDP
	s := &stepBuilder{cfg: cfg, l: l, o: o, sh: sh, units: units, last: len(units) - 1,
		fsdp: fsdp, gathered: fsdp || p.Compute != p.Param, order: job.NewStepOrder(cfg, l, b.GradAccum),
		wlive: make([]liveWeights, len(units)), T: int64(sh.Batch) * int64(sh.Seq), V: int64(cfg.Vocab)}
	savedBytes, err := s.loadSaved()
	if err != nil {
		return nil, nil, err
	}
	// Under grad-sync-last-only the first micro-step that reduces is the
	// last: the ones before accumulate unsharded.
	for !s.order.Reduces(s.firstReduce) {
		s.syncLast = true
		s.firstReduce++
	}
	// Under grad-sync-last-only nothing is reduce-scattered before the last
	// micro-step, so there is no partial reduce output to keep.
	if s.order.KeepsPartial() {
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
	kv := s.T * int64(cfg.KVHeads) / tp * int64(cfg.HeadDim) * 2 * act
	s.cpFwd, s.cpBwd = cpBuffers(max(sh.CP, 1), sh.CPMethod, kv)
	return s, savedBytes, nil
}

// loadSaved fills saved, none and lossSaved and returns the saved bytes per
// unit.
func (s *stepBuilder) loadSaved() ([]int64, error) {
	savedBytes := make([]int64, len(s.units))
	noneShape := s.sh
	noneShape.AC = moe.AC{Mode: moe.ACNone}
	// A block's tables depend on its index only through whether it is a
	// MoE block, whether the policy checkpoints it fully and its attention
	// (window, chunk, and RoPE, which decides Llama 4's L2 QK-norm): Saved,
	// moe.SavedTensors, compiledBlock and tpSaved read nothing else of the
	// layer (TestLoadSavedPerLayer checks it on random configs), so one
	// block of each kind is computed and the others take its records.
	type kind struct {
		moe, full, noRope bool
		window, chunk     int
	}
	kinds := map[kind][2][]moe.SavedRecord{}
	for i, u := range s.units {
		k := kind{}
		block := u.Layer >= 0 && u.Layer < s.cfg.Layers
		if block {
			l := u.Layer
			k = kind{moe: s.cfg.MoELayer[l], full: s.sh.AC.FullyCheckpointed(l), noRope: s.cfg.NoRope != nil && s.cfg.NoRope[l],
				window: s.cfg.Window[l]}
			if s.cfg.Chunk != nil {
				k.chunk = s.cfg.Chunk[l]
			}
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

// weights is the bytes of unit u's compute weights: the compute type's,
// but for those an fp8 all-gather gathers (one byte each; torchtitan
// applies it only where FSDP shards them, job.Recipe.GathersFP8In).
func (s *stepBuilder) weights(u Unit) int64 {
	var fp8 int64
	if !s.l.FSDPShards() {
		return u.Local * s.o.Precision.Compute.Bytes()
	}
	if s.o.FP8Gather.Linear {
		fp8 += u.Linear
	}
	if s.o.FP8Gather.Output {
		fp8 += u.Output
	}
	return u.Local*s.o.Precision.Compute.Bytes() - fp8*(s.o.Precision.Compute.Bytes()-1)
}

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
		s.forward(s.order.Forward(m))
		s.backward(m, s.order.Backward(m))
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

// setup emits what is live when the step begins: the CUDA graphs' static
// buffers (graphs.go); per unit, as StateOf sums them: stored parameters (and buffers), then each AdamW moment (and the
// master copy) per unit; on a pipeline stage (keep), every unit's gathered
// weights.
func (s *stepBuilder) setup() {
	s.phase, s.micro = Setup, -1
	if n := graphStaticBytes(s.cfg, s.o.CUDAGraphs, s.sh); n > 0 {
		s.alloc(moe.LayerEmbed, "cuda_graph_static", n, CatGraphs)
	}
	for _, u := range s.units {
		us := StateOf([]Unit{u}, s.l.Sharding, s.o)
		s.alloc(u.Layer, "parameters", us.Params, CatParams)
	}
	for _, u := range s.units {
		us := StateOf([]Unit{u}, s.l.Sharding, s.o)
		s.alloc(u.Layer, "optimizer_state", us.Optimizer, CatOptimizer)
	}
	if s.keep {
		for i := range s.units {
			s.allocWeights(i, "weights")
		}
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
