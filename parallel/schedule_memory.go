package parallel

import "github.com/moescope/moescope/memory"

// attachMemory hands the memory package's timeline of the step to the ops:
// setup events to Schedule.Setup, and each run of events of one (phase,
// micro-step, unit layer) to the first compute op of that phase,
// micro-step and layer at or after the op that took the previous run
// (recompute ops count as backward, as the memory timeline places
// checkpoint recomputation there); a run of communication buffers only (the
// prefetch of the next unit's all-gather, the free of the previous unit's
// reduce-scatter buffer) stays with the op that took the previous run. The order is never changed, so Setup
// followed by every op's Mem in op order is the timeline itself, and
// memory.Replay of it gives the peak Schedule.Peak records.
func (b *schedBuilder) attachMemory(evs []memory.Event) {
	ops := b.s.Ops
	phaseOf := func(o ScheduleOp) memory.Phase {
		switch o.Phase {
		case PhaseForward:
			return memory.Forward
		case PhaseOptimizer:
			return memory.Optimizer
		}
		return memory.Backward
	}
	at := 0
	for i := 0; i < len(evs); {
		e := evs[i]
		j := i
		for j < len(evs) && evs[j].Phase == e.Phase && evs[j].Micro == e.Micro && evs[j].Layer == e.Layer {
			j++
		}
		if e.Phase == memory.Setup {
			b.s.Setup = append(b.s.Setup, evs[i:j]...)
			i = j
			continue
		}
		comm := true // communication buffers (a prefetch, a previous unit's reduce-scatter) stay with the current op
		for _, x := range evs[i:j] {
			comm = comm && x.Category == memory.CatComm
		}
		for k := at; k < len(ops) && !comm; k++ {
			o := ops[k]
			if o.Type == OpCompute && phaseOf(o) == e.Phase && (o.Phase == PhaseOptimizer || o.Micro == e.Micro && o.Layer == e.Layer) {
				at = k
				break
			}
		}
		ops[at].Mem = append(ops[at].Mem, evs[i:j]...)
		i = j
	}
}
