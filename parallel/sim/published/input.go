package published

import (
	"fmt"

	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim"
)

// InputForRun turns a measured run into the layout to simulate: its
// model (built-in name or path), device, cluster (the run's, else the
// GPU's usual one), layout, checkpointing and batch.
func InputForRun(r Run) (sim.Input, error) {
	if r.PowerLimited {
		return sim.Input{}, fmt.Errorf("run %s: power_limited: its GPUs ran below their default power limit, which the source does not state; the time model prices %s at its default limit only", r.Label(), r.GPU)
	}
	cfg, err := r.LoadModel()
	if err != nil {
		return sim.Input{}, err
	}
	dev, cl, err := hw.Resolve(r.GPU, r.Cluster)
	if err != nil {
		return sim.Input{}, err
	}
	spec, err := r.SpecFor(cfg)
	if err != nil {
		return sim.Input{}, err
	}
	return sim.Input{Spec: spec, Device: dev, Cluster: cl}, nil
}
