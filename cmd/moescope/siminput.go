package main

import (
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim"
)

// simInput is the virtual-time backend's input for run s on a device and
// cluster, under a calibration (nil: uncalibrated).
func simInput(s job.Spec, dev hw.Device, cl *hw.Cluster, cal *sim.Calibration) sim.Input {
	r := s.Recipe
	in := sim.Input{Config: s.Model, Layout: s.Layout, AC: s.AC, LBS: s.LBS, Seq: s.Seq, GradAccum: s.GradAccum,
		Device: dev, Cluster: cl, Calibration: cal, ExpertSkew: r.ExpertSkew, Precision: string(r.Precision),
		Torch: sim.TorchVersion{Major: r.Torch.Major, Minor: r.Torch.Minor}, FusedElementwise: r.FusedElementwise,
		AttentionKernel: sim.AttentionKernel(r.Attention), Memory: memory.OptionsOf(r, s.AC)}
	if r.Dispatcher.RowPerRank() {
		in.Dispatcher = sim.DeepEPDispatch
	}
	if r.ExpertGEMM == job.CuBLASExperts {
		in.ExpertGEMM = sim.CuBLASExperts
	}
	return in
}
