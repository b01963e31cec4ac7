package memory

import (
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

func (s *stepBuilder) allocComm(layer int, label string, n int64) {
	s.emit(true, layer, label, n, CatComm, CommStream)
}

func (s *stepBuilder) freeComm(layer int, label string, n int64) {
	s.emit(false, layer, label, n, CatComm, CommStream)
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
			rs = rs[:3] // chunked loss keeps no vocabulary-sized tensor
		}
		rn, err := Saved(cfg, u.Layer, noneShape)
		if err != nil {
			return nil, nil, err
		}
		s.saved = append(s.saved, rs)
		s.none = append(s.none, rn)
		savedBytes[i] = SavedBytes(rs)
	}
	st := StateOf(units, l.Sharding, o)
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
	s.alloc(moe.LayerEmbed, "parameters", st.Params, CatParams)
	s.alloc(moe.LayerEmbed, "optimizer_state", st.Optimizer, CatOptimizer)
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
	var optElems int64
	for _, u := range units {
		if l.Sharding == moe.ShardDDP {
			optElems += u.Local
		} else {
			optElems += u.Shard
		}
	}
	T := int64(sh.Batch) * int64(sh.Seq)
	act := p.Activation.Bytes()
	D := int64(cfg.Hidden)
	V := int64(cfg.Vocab)
	// The head's saved tensors without the loss's (allocated by lossForward).
	headSaved := SavedBytes(s.saved[last][:3])
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
					s.allocComm(u.Layer, "allgather", weights(u))
				}
				// Copy-out of the all-gather into the unsharded parameters.
				s.alloc(u.Layer, "weights", weights(u), CatWeights)
				s.freeComm(u.Layer, "allgather", weights(u))
				if i+1 < n {
					s.allocComm(units[i+1].Layer, "allgather", weights(units[i+1])) // prefetch
				}
			case !fsdp && gathered:
				s.alloc(u.Layer, "weights", weights(u), CatWeights)
			}
			if i == last {
				s.alloc(u.Layer, "saved", headSaved, CatActivations)
				s.lossForward(u.Layer, T, V, savedBytes[i]-headSaved)
			} else {
				s.alloc(u.Layer, "saved", savedBytes[i], CatActivations)
			}
			if u.Layer >= 0 && i != last {
				ws := largest(s.none[i])
				s.alloc(u.Layer, "workspace", ws, CatWorkspace)
				if cfg.MoELayer[u.Layer] {
					s.allocComm(u.Layer, "a2a_dispatch", a2a)
					s.freeComm(u.Layer, "a2a_dispatch", a2a)
					s.allocComm(u.Layer, "a2a_combine", a2a)
					s.freeComm(u.Layer, "a2a_combine", a2a)
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
			s.alloc(moe.LayerEmbed, "partial_reduce", partial, CatGrads)
		}
		prevRS, prevDX := -1, -1 // unit indices
		dx := T * D * act
		for i := last; i >= 0; i-- {
			u := units[i]
			wlabel := "weights"
			if resharded[i] {
				wlabel = "weights_bwd"
				s.alloc(u.Layer, wlabel, weights(u), CatWeights)
				s.freeComm(u.Layer, "allgather_bwd", weights(u))
			}
			if i > 0 && resharded[i-1] {
				s.allocComm(units[i-1].Layer, "allgather_bwd", weights(units[i-1])) // prefetch
			}
			var rec, ws int64
			switch {
			case i == last:
				s.lossBackward(u.Layer, T, V, savedBytes[i]-headSaved)
			case u.Layer >= 0:
				rec = SavedBytes(s.none[i]) - savedBytes[i]
				s.alloc(u.Layer, "recompute", rec, CatRecompute)
				ws = 2 * largest(s.none[i])
				s.alloc(u.Layer, "workspace_bwd", ws, CatWorkspace)
				if cfg.MoELayer[u.Layer] {
					s.allocComm(u.Layer, "a2a_combine_bwd", a2a)
					s.freeComm(u.Layer, "a2a_combine_bwd", a2a)
					s.allocComm(u.Layer, "a2a_dispatch_bwd", a2a)
					s.freeComm(u.Layer, "a2a_dispatch_bwd", a2a)
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
			s.free(u.Layer, "recompute", rec, CatRecompute)
			if i == last {
				s.free(u.Layer, "saved", headSaved, CatActivations)
			} else {
				s.free(u.Layer, "saved", savedBytes[i], CatActivations)
			}
			// The previous unit's reduce-scatter ran while this unit computed.
			if prevRS >= 0 {
				s.freeComm(units[prevRS].Layer, "reduce_scatter", units[prevRS].Local*p.Grad.Bytes())
			}
			s.allocComm(u.Layer, "reduce_scatter", u.Local*p.Grad.Bytes())
			prevRS = i
			s.free(u.Layer, "unsharded_grads", u.Local*p.Compute.Bytes(), CatUnshardGrad)
			if m == 0 {
				// The reduce-scatter output becomes the gradient: it is
				// allocated by the communication stream's pool.
				s.emit(true, u.Layer, "gradients", gradShard(u), CatGrads, CommStream)
			}
			if gathered && !keep {
				s.free(u.Layer, wlabel, weights(u), CatWeights)
			}
		}
		s.freeComm(units[prevRS].Layer, "reduce_scatter", units[prevRS].Local*p.Grad.Bytes())
	}
	if partial > 0 {
		s.phase, s.micro = Backward, 0
		s.free(moe.LayerEmbed, "partial_reduce", partial, CatGrads)
	}
	// Optimizer: foreach AdamW materializes sqrt(v) for every local element.
	s.phase, s.micro = Optimizer, -1
	opt := optElems * p.Optimizer.Bytes()
	s.alloc(moe.LayerEmbed, "adamw_sqrt_v", opt, CatOptTemp)
	s.free(moe.LayerEmbed, "adamw_sqrt_v", opt, CatOptTemp)
	// zero_grad(set_to_none=True) releases the gradients.
	s.micro = 0
	for _, u := range units {
		s.emit(false, u.Layer, "gradients", gradShard(u), CatGrads, CommStream)
	}
	return s.events, savedBytes, nil
}

// lossForward emits the LM head's logits and the cross-entropy: bf16
// logits (freed before backward, as torchtitan's `del pred`), their fp32
// copy, and the fp32 log-probabilities (saved, counted in "saved").
func (s *stepBuilder) lossForward(layer int, T, V, lossSaved int64) {
	act := s.o.Precision.Activation.Bytes()
	if c := int64(s.o.LossChunks); c > 1 {
		tc := (T + c - 1) / c
		s.alloc(layer, "loss_chunk", tc*V*(act+8), CatLoss)
		s.free(layer, "loss_chunk", tc*V*(act+8), CatLoss)
		return
	}
	s.alloc(layer, "logits", T*V*act, CatLoss)
	s.alloc(layer, "logits_f32", T*V*4, CatLoss)
	s.alloc(layer, "loss_saved", lossSaved, CatActivations)
	s.free(layer, "logits_f32", T*V*4, CatLoss)
	s.free(layer, "logits", T*V*act, CatLoss)
}

// lossBackward emits the gradients of the loss: nll_loss's T×V fp32
// gradient, log_softmax's fp32 input gradient, and its cast to the
// activation type for the LM head.
func (s *stepBuilder) lossBackward(layer int, T, V, lossSaved int64) {
	act := s.o.Precision.Activation.Bytes()
	if c := int64(s.o.LossChunks); c > 1 {
		tc := (T + c - 1) / c
		s.alloc(layer, "loss_chunk_bwd", tc*V*(act+12), CatLoss)
		s.free(layer, "loss_chunk_bwd", tc*V*(act+12), CatLoss)
		return
	}
	s.alloc(layer, "grad_log_probs", T*V*4, CatLoss)
	s.alloc(layer, "grad_logits_f32", T*V*4, CatLoss)
	s.free(layer, "grad_log_probs", T*V*4, CatLoss)
	s.free(layer, "loss_saved", lossSaved, CatActivations)
	s.alloc(layer, "grad_logits", T*V*act, CatLoss)
	s.free(layer, "grad_logits_f32", T*V*4, CatLoss)
	s.free(layer, "grad_logits", T*V*act, CatLoss)
}
