package sim

import (
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// InputFor is the virtual-time backend's input for run s on a device and
// cluster (nil: the device's usual one), under a calibration (nil:
// uncalibrated). The caller sets the simulator's own options (timeline,
// interval, memory target) on the result.
func InputFor(s job.Spec, dev hw.Device, cl *hw.Cluster, cal *cost.Calibration) Input {
	r := s.Recipe
	in := Input{Config: s.Model, Layout: s.Layout, AC: s.AC, LBS: s.LBS, Seq: s.Seq, GradAccum: s.GradAccum,
		Device: dev, Cluster: cl, Calibration: cal, ExpertSkew: r.ExpertSkew, Precision: string(r.Precision),
		Torch: TorchVersion{Major: r.Torch.Major, Minor: r.Torch.Minor}, FusedElementwise: r.FusedElementwise,
		AttentionKernel: cost.AttentionKernel(r.Attention), Memory: memory.OptionsOf(r, s.AC)}
	if r.Dispatcher.RowPerRank() {
		in.Dispatcher = DeepEPDispatch
	}
	if r.ExpertGEMM == job.CuBLASExperts {
		in.ExpertGEMM = cost.CuBLASExperts
	}
	return in
}
