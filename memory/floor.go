package memory

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// SetupBytes is a lower bound of the peak reserved bytes of one rank of
// layout l under options o, whatever the batch: the parameters and
// optimizer state live when the step begins (StateOf's Params +
// Optimizer, what the timeline's setup allocates per unit), on the
// pipeline rank that holds the most. Every setup allocation is live at
// once before the first forward, the allocator rounds each request up,
// and reserved memory holds every live block, so Estimate's
// Peak.Reserved is never below it. A planner prunes with it a layout whose
// state alone exceeds the device, without building a timeline.
func SetupBytes(cfg *moe.Config, l job.Layout, o Options) (int64, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	o, err := o.normalized()
	if err != nil {
		return 0, err
	}
	units, err := Units(cfg, l)
	if err != nil {
		return 0, err
	}
	setup := func(us []Unit) int64 {
		st := StateOf(us, l.Sharding, o)
		return st.Params + st.Optimizer
	}
	if l.Stages() == 1 {
		return setup(units), nil
	}
	split, err := l.StageSplit(cfg.Layers)
	if err != nil {
		return 0, err
	}
	chunks, err := StageUnits(units, split)
	if err != nil {
		return 0, err
	}
	var most int64
	for r := range l.Stages() {
		var us []Unit
		for k := range l.VirtualStages() {
			us = append(us, chunks[r+k*l.Stages()]...)
		}
		most = max(most, setup(us))
	}
	return most, nil
}
