package published

import (
	"fmt"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// InputForRun turns a measured run into the layout to simulate: its
// model (built-in name or path), device, cluster (the run's, else the
// GPU's usual one), layout, checkpointing and batch.
func InputForRun(r Run) (sim.Input, error) {
	if r.PowerLimited {
		return sim.Input{}, fmt.Errorf("run %s: power_limited: its GPUs ran below their default power limit, which the source does not state; the time model prices %s at its default limit only", r.Label(), r.GPU)
	}
	cfg, err := hf.Load(r.Model)
	if err != nil {
		return sim.Input{}, err
	}
	dev, err := hw.LookupDevice(r.GPU)
	if err != nil {
		return sim.Input{}, err
	}
	cname := r.Cluster
	if cname == "" {
		cname = hw.ClusterForGPU(dev.Name)
	}
	cl, err := hw.LoadCluster(cname)
	if err != nil {
		return sim.Input{}, err
	}
	l, err := r.Layout()
	if err != nil {
		return sim.Input{}, err
	}
	ac, err := moe.ParseAC(r.AC)
	if err != nil {
		return sim.Input{}, err
	}
	if err := sim.CheckPrecision("precision", r.Precision); err != nil {
		return sim.Input{}, err
	}
	mo, err := r.MemoryOptions()
	if err != nil {
		return sim.Input{}, err
	}
	tv, err := sim.ParseTorchVersion("torch_version", r.TorchVersion)
	if err != nil {
		return sim.Input{}, err
	}
	disp, err := sim.ParseDispatcher("dispatcher", r.Dispatcher)
	if err != nil {
		return sim.Input{}, err
	}
	experts, err := cost.ParseExpertGEMM("expert_gemm", r.ExpertGEMM)
	if err != nil {
		return sim.Input{}, err
	}
	return sim.Input{Config: cfg, Layout: l, AC: ac, LBS: r.LBS, Seq: r.Seq, GradAccum: max(1, r.GradAccum), Device: dev, Cluster: cl,
		Memory: mo, AttentionKernel: cost.AttentionKernel(r.AttentionKernel), Precision: r.Precision, Torch: tv, FusedElementwise: r.FusedElementwise, Dispatcher: disp, ExpertGEMM: experts}, nil
}
