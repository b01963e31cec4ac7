package memory

import (
	"fmt"
	"iter"

	"github.com/moescope/moescope/moe"
)

// stepBuilder emits the events of one training step (see the package doc
// for their order).
type stepBuilder struct {
	cfg    *moe.Config
	l      moe.Layout
	o      Options
	sh     Shape
	units  []Unit
	saved  [][]moe.SavedRecord // per unit, under the policy
	none   [][]moe.SavedRecord // per unit, without checkpointing
	events []Event
	phase  Phase
	micro  int
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

// allocRecords allocates one tensor per record (label prefix, op, tensor).
func (s *stepBuilder) allocRecords(prefix string, rs []moe.SavedRecord, c Category) {
	for _, r := range rs {
		s.alloc(r.Layer, prefix+" "+string(r.Op)+" "+r.Tensor, r.Bytes(), c)
	}
}

func (s *stepBuilder) freeRecords(prefix string, rs []moe.SavedRecord, c Category) {
	for _, r := range rs {
		s.free(r.Layer, prefix+" "+string(r.Op)+" "+r.Tensor, r.Bytes(), c)
	}
}

// missing returns the records of none that saved lacks (by op and tensor):
// what backward rebuilds by recomputation.
func missing(none, saved []moe.SavedRecord) []moe.SavedRecord {
	have := map[[2]string]bool{}
	for _, r := range saved {
		have[[2]string{string(r.Op), r.Tensor}] = true
	}
	var out []moe.SavedRecord
	for _, r := range none {
		if !have[[2]string{string(r.Op), r.Tensor}] {
			out = append(out, r)
		}
	}
	return out
}

// buildTimeline returns the events of one step and the saved bytes per unit.
func buildTimeline(cfg *moe.Config, l moe.Layout, b Batch, o Options, sh Shape, units []Unit) ([]Event, []int64, error) {
	s := &stepBuilder{cfg: cfg, l: l, o: o, sh: sh, units: units}
	savedBytes := make([]int64, len(units))
	noneShape := sh
	noneShape.AC = moe.AC{Mode: moe.ACNone}
	for i, u := range units {
		rs, err := Saved(cfg, u.Layer, sh)
		if err != nil {
			return nil, nil, err
		}
		if u.Layer == cfg.LayerHead() && o.LossChunks > 1 {
			rs = withoutLogProbs(rs)
		}
		rn, err := Saved(cfg, u.Layer, noneShape)
		if err != nil {
			return nil, nil, err
		}
		s.saved = append(s.saved, rs)
		s.none = append(s.none, rn)
		savedBytes[i] = SavedBytes(rs)
	}
	p := o.Precision
	fsdp := l.Sharding == moe.ShardFSDP
	// gathered: a unit's compute weights are a separate allocation (FSDP
	// all-gather, or an autocast copy when compute and storage types differ).
	gathered := fsdp || p.Compute != p.Param
	keep := fsdp && l.KeepGathered
	weights := func(u Unit) int64 { return u.Local * p.Compute.Bytes() }
	gradShard := func(u Unit) int64 {
		if l.Sharding == moe.ShardFSDP || l.Sharding == moe.ShardZeRO2 {
			return u.Shard * p.Grad.Bytes()
		}
		return u.Local * p.Grad.Bytes()
	}
	n := len(units)
	last := n - 1 // the head
	// resharded[i]: unit i's weights are freed after its forward.
	resharded := make([]bool, n)
	for i, u := range units {
		resharded[i] = fsdp && !keep && l.ReshardAfterForward && u.Layer != cfg.LayerHead() && u.Layer != cfg.Layers-1
	}

	s.phase, s.micro = Setup, -1
	// Per unit, as StateOf sums them: stored parameters (and buffers), then
	// each AdamW moment (and the master copy) per unit.
	for _, u := range units {
		us := StateOf([]Unit{u}, l.Sharding, o)
		s.alloc(u.Layer, "parameters", us.Params, CatParams)
	}
	for _, u := range units {
		us := StateOf([]Unit{u}, l.Sharding, o)
		s.alloc(u.Layer, "optimizer_state", us.Optimizer, CatOptimizer)
	}
	if keep {
		for _, u := range units {
			s.alloc(u.Layer, "weights", weights(u), CatWeights)
		}
	}
	partial := int64(0)
	if l.AllreduceLastOnly && l.DPReplicate > 1 && b.GradAccum > 1 {
		for _, u := range units {
			partial += gradShard(u)
		}
	}
	optTemp := func(u Unit) int64 {
		if l.Sharding == moe.ShardDDP {
			return u.Local * p.Optimizer.Bytes()
		}
		return u.Shard * p.Optimizer.Bytes()
	}
	T := int64(sh.Batch) * int64(sh.Seq)
	act := p.Activation.Bytes()
	D := int64(cfg.Hidden)
	V := int64(cfg.Vocab)
	// Unchunked, the loss's own saved tensors are allocated by lossForward
	// inside the logits' lifetime; the rest of the head's (and, chunked,
	// the labels the chunks' checkpoints hold) with the head's forward.
	var headSaved, lossSaved []moe.SavedRecord
	for _, r := range s.saved[last] {
		if r.Op == moe.OpLoss && o.LossChunks <= 1 {
			lossSaved = append(lossSaved, r)
		} else {
			headSaved = append(headSaved, r)
		}
	}
	AG, RS := AllGatherStream, ReduceScatterStream
	a2a := int64(0)
	if l.EP > 1 {
		a2a = T * int64(cfg.TopK) * D * act
	}
	for m := 0; m < b.GradAccum; m++ {
		s.micro = m
		// Forward.
		s.phase = Forward
		for i, u := range units {
			switch {
			case fsdp && !keep:
				if i == 0 {
					s.allocOn(AG, u.Layer, "allgather", weights(u))
				}
				// Copy-out of the all-gather into the unsharded parameters.
				s.alloc(u.Layer, "weights", weights(u), CatWeights)
				s.freeOn(AG, u.Layer, "allgather", weights(u))
				if i+1 < n {
					s.allocOn(AG, units[i+1].Layer, "allgather", weights(units[i+1])) // prefetch
				}
			case !fsdp && gathered:
				s.alloc(u.Layer, "weights", weights(u), CatWeights)
			}
			if i == last {
				s.allocRecords("saved", headSaved, CatActivations)
				s.lossForward(u.Layer, T, V, lossSaved)
			} else {
				s.allocRecords("saved", s.saved[i], CatActivations)
			}
			if u.Layer >= 0 && i != last {
				ws := largest(s.none[i])
				s.alloc(u.Layer, "workspace", ws, CatWorkspace)
				if cfg.MoELayer[u.Layer] {
					// All-to-all send buffers, on the compute stream
					// (torchtitan's all_to_all_single runs there).
					s.alloc(u.Layer, "a2a_dispatch", a2a, CatComm)
					s.free(u.Layer, "a2a_dispatch", a2a, CatComm)
					s.alloc(u.Layer, "a2a_combine", a2a, CatComm)
					s.free(u.Layer, "a2a_combine", a2a, CatComm)
				}
				s.free(u.Layer, "workspace", ws, CatWorkspace)
			}
			if resharded[i] {
				s.free(u.Layer, "weights", weights(u), CatWeights)
			}
		}
		// Backward, units in reverse.
		s.phase = Backward
		if m == 0 && partial > 0 {
			s.emit(true, moe.LayerEmbed, "partial_reduce", partial, CatGrads, RS)
		}
		prevRS, prevDX := -1, -1 // unit indices
		dx := T * D * act
		for i := last; i >= 0; i-- {
			u := units[i]
			wlabel := "weights"
			if resharded[i] {
				wlabel = "weights_bwd"
				s.alloc(u.Layer, wlabel, weights(u), CatWeights)
				s.freeOn(AG, u.Layer, "allgather_bwd", weights(u))
			}
			if i > 0 && resharded[i-1] {
				s.allocOn(AG, units[i-1].Layer, "allgather_bwd", weights(units[i-1])) // prefetch
			}
			var rec []moe.SavedRecord
			var ws int64
			switch {
			case i == last:
				s.lossBackward(u.Layer, T, V, lossSaved)
			case u.Layer >= 0:
				rec = missing(s.none[i], s.saved[i])
				s.allocRecords("recompute", rec, CatRecompute)
				ws = 2 * largest(s.none[i])
				s.alloc(u.Layer, "workspace_bwd", ws, CatWorkspace)
				if cfg.MoELayer[u.Layer] {
					s.alloc(u.Layer, "a2a_combine_bwd", a2a, CatComm)
					s.free(u.Layer, "a2a_combine_bwd", a2a, CatComm)
					s.alloc(u.Layer, "a2a_dispatch_bwd", a2a, CatComm)
					s.free(u.Layer, "a2a_dispatch_bwd", a2a, CatComm)
				}
			}
			if u.Layer != moe.LayerEmbed {
				s.alloc(u.Layer, "grad_hidden", dx, CatWorkspace)
			}
			if prevDX >= 0 {
				s.free(units[prevDX].Layer, "grad_hidden", dx, CatWorkspace)
			}
			prevDX = i
			s.alloc(u.Layer, "unsharded_grads", u.Local*p.Compute.Bytes(), CatUnshardGrad)
			s.free(u.Layer, "workspace_bwd", ws, CatWorkspace)
			s.freeRecords("recompute", rec, CatRecompute)
			if i == last {
				s.freeRecords("saved", headSaved, CatActivations)
			} else {
				s.freeRecords("saved", s.saved[i], CatActivations)
			}
			// The previous unit's reduce-scatter ran while this unit
			// computed. FSDP2 (torch ≥ 2.6 foreach_reduce) copies the
			// gradients into the reduce-scatter input on the compute
			// stream and allocates the output, which becomes the
			// gradient, on the reduce-scatter stream.
			if prevRS >= 0 {
				s.free(units[prevRS].Layer, "reduce_scatter", units[prevRS].Local*p.Grad.Bytes(), CatComm)
			}
			s.alloc(u.Layer, "reduce_scatter", u.Local*p.Grad.Bytes(), CatComm)
			prevRS = i
			s.free(u.Layer, "unsharded_grads", u.Local*p.Compute.Bytes(), CatUnshardGrad)
			if m == 0 {
				// The reduce-scatter output becomes the gradient: it is
				// allocated in the reduce-scatter stream's pool.
				s.emit(true, u.Layer, "gradients", gradShard(u), CatGrads, RS)
			}
			if gathered && !keep {
				s.free(u.Layer, wlabel, weights(u), CatWeights)
			}
		}
		s.free(units[prevRS].Layer, "reduce_scatter", units[prevRS].Local*p.Grad.Bytes(), CatComm)
	}
	if partial > 0 {
		s.phase, s.micro = Backward, 0
		s.emit(false, moe.LayerEmbed, "partial_reduce", partial, CatGrads, RS)
	}
	// Optimizer: foreach AdamW materializes sqrt(v) for every local element
	// at once, one tensor per parameter (here: per unit), then frees them.
	// The fused implementation updates in place.
	s.phase, s.micro = Optimizer, -1
	if o.OptimizerImpl == Foreach {
		for _, u := range units {
			s.alloc(u.Layer, "adamw_sqrt_v", optTemp(u), CatOptTemp)
		}
		for _, u := range units {
			s.free(u.Layer, "adamw_sqrt_v", optTemp(u), CatOptTemp)
		}
	}
	// zero_grad(set_to_none=True) releases the gradients.
	s.micro = 0
	for _, u := range units {
		s.emit(false, u.Layer, "gradients", gradShard(u), CatGrads, RS)
	}
	return s.events, savedBytes, nil
}

// withoutLogProbs drops the loss's log-probabilities, the one
// vocabulary-sized tensor the head keeps: a chunked loss checkpoints each
// chunk and recomputes them in backward. The labels stay, held by the
// chunks' checkpoints as their inputs as nll_loss holds them unchunked.
func withoutLogProbs(rs []moe.SavedRecord) []moe.SavedRecord {
	var out []moe.SavedRecord
	for _, r := range rs {
		if r.Op != moe.OpLoss || r.Tensor != "log_probs" {
			out = append(out, r)
		}
	}
	return out
}

// lossChunks yields the label suffix and token count of each chunk of the
// chunked loss: ⌈T/c⌉ tokens each, the last one shorter (torch.chunk's
// split, which may give fewer than c chunks).
func (s *stepBuilder) lossChunks(T int64) iter.Seq2[string, int64] {
	return func(yield func(string, int64) bool) {
		c := int64(s.o.LossChunks)
		tc := (T + c - 1) / c
		for k := int64(0); k < c && k*tc < T; k++ {
			if !yield(fmt.Sprintf(" chunk %d", k), min(tc, T-k*tc)) {
				return
			}
		}
	}
}

// logProbs emits the LM head's logits of n = tokens × V elements (in the
// activation type), their fp32 copy and the fp32 log-probabilities
// computed from it (keep allocates them), then the frees of the copy and
// of the logits (torchtitan's `del pred`). suffix ends each label.
func (s *stepBuilder) logProbs(layer int, suffix string, n int64, keep func()) {
	act := s.o.Precision.Activation.Bytes()
	s.alloc(layer, "logits"+suffix, n*act, CatLoss)
	s.alloc(layer, "logits_f32"+suffix, n*4, CatLoss)
	keep()
	s.free(layer, "logits_f32"+suffix, n*4, CatLoss)
	s.free(layer, "logits"+suffix, n*act, CatLoss)
}

// lossForward emits the head's logits and cross-entropy (logProbs), the
// log-probabilities being saved. With LossChunks > 1 each chunk does the
// same and frees its log-probabilities too (the chunk is checkpointed and
// recomputed in backward).
func (s *stepBuilder) lossForward(layer int, T, V int64, lossSaved []moe.SavedRecord) {
	if s.o.LossChunks <= 1 {
		s.logProbs(layer, "", T*V, func() { s.allocRecords("saved", lossSaved, CatActivations) })
		return
	}
	for l, tokens := range s.lossChunks(T) {
		n := tokens * V
		s.logProbs(layer, l, n, func() { s.alloc(layer, "log_probs"+l, n*4, CatLoss) })
		s.free(layer, "log_probs"+l, n*4, CatLoss)
	}
}

// lossBackward emits the gradients of the loss (lossGrads). Chunked, each
// chunk first recomputes its logits and log-probabilities.
func (s *stepBuilder) lossBackward(layer int, T, V int64, lossSaved []moe.SavedRecord) {
	if s.o.LossChunks <= 1 {
		s.lossGrads(layer, "", T*V, func() { s.freeRecords("saved", lossSaved, CatActivations) })
		return
	}
	for l, tokens := range s.lossChunks(T) {
		n := tokens * V
		s.logProbs(layer, "_bwd"+l, n, func() { s.alloc(layer, "log_probs_bwd"+l, n*4, CatLoss) })
		s.lossGrads(layer, l, n, func() { s.free(layer, "log_probs_bwd"+l, n*4, CatLoss) })
	}
}

// lossGrads emits, for n = tokens × V elements, nll_loss's fp32 gradient,
// log_softmax's fp32 input gradient, the free of the log-probabilities
// (freeLogProbs: backward has read them) and the cast of the gradient to the
// activation type for the LM head.
func (s *stepBuilder) lossGrads(layer int, suffix string, n int64, freeLogProbs func()) {
	act := s.o.Precision.Activation.Bytes()
	s.alloc(layer, "grad_log_probs"+suffix, n*4, CatLoss)
	s.alloc(layer, "grad_logits_f32"+suffix, n*4, CatLoss)
	s.free(layer, "grad_log_probs"+suffix, n*4, CatLoss)
	freeLogProbs()
	s.alloc(layer, "grad_logits"+suffix, n*act, CatLoss)
	s.free(layer, "grad_logits_f32"+suffix, n*4, CatLoss)
	s.free(layer, "grad_logits"+suffix, n*act, CatLoss)
}
