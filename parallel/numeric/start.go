package numeric

import "github.com/moescope/moescope/moe/ref"

// Start builds the Trainer of spec, run state describes (its Losses
// empty), from a fresh initialization from seed (ref.Model.InitRandom), or,
// when resume names a checkpoint directory (SaveTrainCheckpoint), from
// that checkpoint's parameters and optimizer state; a checkpoint that
// cannot continue state is refused (TrainCheckpoint.CheckResume). fault
// (nil: none) is armed on the new trainer (SetFault) once a checkpoint's
// optimizer state and step count are loaded, its Step counted from this
// run's first step (0 = the first). The state returned is what a
// checkpoint of this run records: state with the resumed run's losses.
func Start(spec Spec, state TrainState, seed uint64, resume string, fault *Fault) (*Trainer, TrainState, error) {
	cfg := spec.Model
	var init [][]float32
	var loaded *TrainCheckpoint
	if resume != "" {
		var err error
		if loaded, err = LoadTrainCheckpoint(resume, cfg); err != nil {
			return nil, TrainState{}, err
		}
		if err := loaded.CheckResume(state); err != nil {
			return nil, TrainState{}, err
		}
		init = loaded.Params
		state.Losses = loaded.State.Losses
	} else {
		m, err := ref.NewModel[float32](cfg)
		if err != nil {
			return nil, TrainState{}, err
		}
		m.InitRandom(seed)
		init = m.Tensors()
	}
	n, err := New(spec, init)
	if err != nil {
		return nil, TrainState{}, err
	}
	if loaded != nil {
		if err := n.SetOptimizerState(loaded.M, loaded.V, int64(loaded.State.Step)); err != nil {
			return nil, TrainState{}, err
		}
	}
	if fault != nil {
		// The fault's step counts this run's steps: a resumed run's first
		// is the checkpoint's step count.
		f := *fault
		f.Step += n.StepIndex()
		fault = &f
	}
	if err := n.SetFault(fault); err != nil {
		return nil, TrainState{}, err
	}
	return n, state, nil
}
