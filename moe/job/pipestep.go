package job

// PipeStep is one action of a pipeline rank in the order of a whole step,
// with what the step does to the action's stage around it, decided here
// once for the pipeline program, the memory timeline and the numeric
// ranks. Inside a stage FSDP follows torchtitan under PP: the stage's
// units are gathered before its first action of the step and stay so
// (torchtitan does not reshard after forward under PP by default, and
// PyTorch's stage does not reshard after backward until the last one), and
// its gradients are reduced once per accumulation micro-step, after its
// last full backward or weight pass (PyTorch's
// backward_maybe_with_nosync counts both; references in pipeline.go).
type PipeStep struct {
	PipeAction
	Accum  int  // the accumulation micro-step
	Gather bool // the stage's first action of the step: its units are gathered before it
	// First: the stage's first full backward or weight pass of the
	// micro-step, which starts its accumulated gradients.
	First bool
	// Reduce: the stage's last full backward or weight pass of the
	// micro-step, after which its gradients are reduced.
	Reduce bool
}

// PipelineStep returns, for each rank of order (PipelineOrder's, m
// micro-batches each), its actions over accum accumulation micro-steps,
// each micro-step running the whole order.
func PipelineStep(order [][]PipeAction, m, accum int) [][]PipeStep {
	out := make([][]PipeStep, len(order))
	for r, actions := range order {
		gathered := map[int]bool{}
		steps := make([]PipeStep, 0, accum*len(actions))
		for acc := range accum {
			done := map[int]int{} // per stage, backwards that completed its weight gradients
			for _, a := range actions {
				st := PipeStep{PipeAction: a, Accum: acc, Gather: !gathered[a.Stage]}
				gathered[a.Stage] = true
				if a.Frees() {
					done[a.Stage]++
					st.First, st.Reduce = done[a.Stage] == 1, done[a.Stage] == m
				}
				steps = append(steps, st)
			}
		}
		out[r] = steps
	}
	return out
}
