package memory

import "github.com/moescope/moescope/moe/job"

// forward emits one micro-step's forward, units in order, walking the
// step's order fw (one phase per unit): per unit its weights
// (gatherForward), its saved tensors, the head's loss or a block's
// transient buffers, and the free of its weights where the phase says
// (reshard-after-forward).
func (s *stepBuilder) forward(fw []job.StepPhase) {
	s.phase = Forward
	for i, u := range s.units {
		s.gatherForward(i, fw)
		s.allocRecords(s.savedSet(i), CatActivations)
		switch {
		case s.isHead(i):
			s.lossForward(u.Layer)
		case u.Layer >= 0:
			s.blockForward(i)
		}
		if fw[i].Free && s.gathered {
			s.freeWeights(i)
		}
	}
}

// gatherForward emits unit i's compute weights for its forward when its
// phase gathers them. Under FSDP: the copy-out of its all-gather, whose
// buffer the previous unit prefetched (the first unit gathers its own),
// and the prefetch of unit i+1's when that one gathers too. Otherwise,
// when compute and storage types differ, the cast copy.
func (s *stepBuilder) gatherForward(i int, fw []job.StepPhase) {
	u := s.units[i]
	w := s.weights(u)
	switch {
	case !fw[i].Gather || !s.gathered:
	case s.fsdp:
		if i == 0 {
			s.allocOn(AllGatherStream, u.Layer, "allgather", w)
		}
		// Copy-out of the all-gather into the unsharded parameters.
		s.allocWeights(i, "weights")
		s.freeOn(AllGatherStream, u.Layer, "allgather", w)
	default:
		s.allocWeights(i, "weights")
	}
	if s.fsdp && i+1 < len(s.units) && fw[i+1].Gather {
		next := s.units[i+1]
		s.allocOn(AllGatherStream, next.Layer, "allgather", s.weights(next)) // prefetch
	}
}

// allocWeights allocates unit i's compute weights under label.
func (s *stepBuilder) allocWeights(i int, label string) {
	s.wlive[i] = liveWeights{label, s.micro}
	s.alloc(s.units[i].Layer, label, s.weights(s.units[i]), CatWeights)
}

// freeWeights frees unit i's compute weights, under the label and the
// micro-step they were allocated with (weights kept gathered from one
// micro-step's backward into the next one's forward).
func (s *stepBuilder) freeWeights(i int) {
	w := s.wlive[i]
	s.emitAt(w.micro, false, s.units[i].Layer, w.label, s.weights(s.units[i]), CatWeights, ComputeStream)
}

// liveWeights is the allocation a unit's live compute weights came from.
type liveWeights struct {
	label string
	micro int
}

// blockForward emits the transient buffers of block unit i's forward: its
// workspace (the largest intermediate) and, on MoE blocks, the all-to-all
// buffers.
func (s *stepBuilder) blockForward(i int) {
	layer := s.units[i].Layer
	ws := largest(s.none[i])
	s.alloc(layer, "workspace", ws, CatWorkspace)
	s.alloc(layer, "cp_kv", s.cpFwd, CatComm)
	s.free(layer, "cp_kv", s.cpFwd, CatComm)
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
