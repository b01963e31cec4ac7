package memory

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
