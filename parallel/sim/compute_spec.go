package sim

import (
	"fmt"

	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// fusedNormSince is the first release whose eager RMSNorm is one fused
// kernel each way (aten._fused_rms_norm, pytorch/pytorch PR #153666, in
// nightlies from August 2025 per pytorch issue #157345, first released in
// 2.9.0); earlier releases run the composite of package cost's eagerBytes.
var fusedNormSince = job.TorchVersion{Major: 2, Minor: 9}

// computeSpec is the compute model of run in on device dev under
// calibration cal: the recipe's low-precision GEMMs, attention and expert kernels, whether
// compiled blocks fuse their elementwise chains, the PyTorch release's
// eager norm and the framework's own fused kernels.
func computeSpec(dev hw.Device, in Input, cal *cost.Calibration) (cost.ComputeSpec, error) {
	spec, err := cost.ComputeSpecFor(dev, in.Attention)
	if err != nil {
		return cost.ComputeSpec{}, fmt.Errorf("simulate: %w", err)
	}
	if spec.LowPrecision, err = cost.LowPrecisionFor(dev, in.Recipe); err != nil {
		return cost.ComputeSpec{}, fmt.Errorf("simulate: %w", err)
	}
	if lp := spec.LowPrecision; lp != nil {
		lp.FP8Gather = in.GathersFP8In(in.Layout)
	}
	spec = spec.WithExperts(in.ExpertGEMM).Calibrated(cal)
	// The slowest node is priced under a calibration only (calibrate
	// records the stored spread in every calibration it writes): the
	// scale-out fit measures how per-GPU throughput falls from a series'
	// smallest run, which a calibration's own runs anchor, not the level
	// an uncalibrated prediction's band already carries (on this
	// commit's published table it made 30 of 52 multi-host runs worse and
	// 22 better: docs/simulate.md).
	spec.NodeSpread = cal.NodeSpreadOr(0)
	spec.Compiled = in.compiledModel()
	spec.CompositeNorm = in.Torch.Before(fusedNormSince)
	spec.FusedElementwise = in.FusedElementwise
	spec.FusedQKV = in.FusedQKV
	return spec, nil
}

// waitsFor sets the GPUs and nodes a step of layout l on cluster cl waits
// for: every rank of the job, since a step ends with collectives over all
// of them (the gradient norm's all-reduce at least).
func waitsFor(spec *cost.ComputeSpec, l job.Layout, cl *hw.Cluster) {
	spec.GPUs, spec.Nodes = l.GPUs, nodes(l, cl)
}

// nodes is how many hosts of cl layout l spans.
func nodes(l job.Layout, cl *hw.Cluster) int { return (l.GPUs + cl.GPUsPerNode - 1) / cl.GPUsPerNode }

// Nodes is how many hosts the prepared run spans.
func (p *Prepared) Nodes() int { return nodes(p.l, p.cl) }
