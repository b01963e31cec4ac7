package cost

import (
	"fmt"

	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// The kernels a run chooses that the compute model prices differently (the
// SDPA backend, the routed experts' GEMMs), and a device's compute spec at
// its measured kernel rates.

// WithExperts sets the routed experts' kernel: per-expert cuBLAS GEMMs run
// at the device's dense GEMM efficiency.
func (c ComputeSpec) WithExperts(k job.ExpertGEMM) ComputeSpec {
	if k == job.CuBLASExperts {
		c.ExpertGEMMEff = c.GEMMEff
	}
	return c
}

// Fallbacks of the compute model for a device file without a kernels
// object (the registry's devices all have one, each number sourced there):
// the H100 SXM's measured rates (parallel/hw/devices/h100.json), which are
// the most widely measured part's. The launch overhead is used for devices
// whose entry gives no launch_overhead_s: the registry's 4 µs, a direct
// cuLaunchKernel dispatch measured on a B200 (parallel/hw/devices/b200.json
// cites it); PyTorch eager's dispatch between kernels adds to it, so
// calibrate.
var fallbackKernels = hw.Kernels{GEMMEff: 0.803, GroupedEff: 0.36, GroupedHalfRows: 406, CuDNNFwdEff: 0.61,
	CuDNNBwdEff: 0.51, Flash2FwdEff: 0.37, Flash2BwdEff: 0.32, MemEff: 0.84, NCCLCTAs: 16,
	SustainedRatio: 0.848, SpeedSD: 0.010, FP8GEMMEff: 0.779, FP8GroupedEff: 0.493, FP8GroupedWgradRatio: 0.762,
	CastEff: 0.570}

const (
	defaultLaunchS = 4e-6
	// fallbackSMs is used for devices without a published SM count.
	fallbackSMs = 132
)

// ComputeSpecOf returns the compute model of a registry device with its
// measured kernel rates (cuDNN attention; Device.Kernels, or the H100
// fallbacks for a device file without them).
func ComputeSpecOf(d hw.Device) ComputeSpec {
	spec, _ := ComputeSpecFor(d, job.CuDNNAttention)
	return spec
}

// ComputeSpecFor is ComputeSpecOf with the attention backend named; an
// unknown backend is an error listing the known ones.
func ComputeSpecFor(d hw.Device, attn job.AttentionKernel) (ComputeSpec, error) {
	sms := d.SMs
	if sms == 0 {
		sms = fallbackSMs
	}
	launch := d.LaunchOverheadS
	if launch == 0 {
		launch = defaultLaunchS
	}
	k := fallbackKernels
	if d.Kernels != nil {
		k = *d.Kernels
	}
	spec := ComputeSpec{PeakFLOPs: d.BF16FLOPs, HBMBytesPerS: d.HBMBytesPerS, SMs: sms, LaunchS: launch,
		GEMMEff: k.GEMMEff, GroupedEff: k.GroupedEff, GroupedHalfRows: k.GroupedHalfRows,
		AttnFwdEff: k.CuDNNFwdEff, AttnBwdEff: k.CuDNNBwdEff, MemEff: k.MemEff, NCCLCTAs: k.NCCLCTAs,
		Sustained: k.SustainedRatio, SpeedSD: k.SpeedSD}
	switch attn {
	case job.CuDNNAttention, "":
	case job.Flash2Attention:
		spec.AttnFwdEff, spec.AttnBwdEff = k.Flash2FwdEff, k.Flash2BwdEff
	default:
		return ComputeSpec{}, fmt.Errorf("attention kernel %q: not priced (priced: %s, %s)", attn, job.CuDNNAttention, job.Flash2Attention)
	}
	return spec, nil
}
