package epbuffer

import (
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// Outside is the memory outside PyTorch's allocator of a rank of run s on
// dev in NVLink domains of domain GPUs (< 1: those of the cluster dev is
// usually sold in, hw.ClusterForGPU): the device's (hw.Device.Outside) and,
// with ep > 1, the all-to-all communicator's point-to-point buffers
// (the device's OutsideEPBytes: what an all_to_all_single communicator's
// per-peer connections add, NVIDIA/nccl issue #1685) or, in their place,
// DeepEP's Buffer (DeepEPBytes) or HybridEP's NVLink buffers
// (HybridEPBytes) for the tokens the rank routes per micro-batch
// (job.Spec.RoutedTokens: a pipeline's micro-batch, not its local batch)
// and its local experts. NCCL connects a peer for send/recv only at
// the first send/recv to it (NVIDIA/nccl issue #1691), and DeepEP and
// HybridEP move tokens through their own buffers, so their expert-parallel
// group's communicator (used for set-up exchanges, all-gathers) opens none.
func Outside(dev hw.Device, s job.Spec, domain int) (int64, error) {
	l := s.Layout
	if l.EP <= 1 || s.Model == nil {
		return dev.Outside(l.EP), nil
	}
	base := dev.Outside(1)
	switch s.Dispatcher {
	case job.DeepEP:
		b, err := DeepEPBytes(s.Model.Hidden, l.EP)
		return base + b, err
	case job.HybridEP:
		if domain < 1 {
			cl, err := hw.LoadCluster(hw.ClusterForGPU(dev.Name))
			if err != nil {
				return 0, err
			}
			domain = cl.NVLinkDomain
		}
		b, err := HybridEPBytes(s.Model.Hidden, int(s.RoutedTokens()), s.Model.Experts/l.EP, l.EP, domain)
		return base + b, err
	}
	return dev.Outside(l.EP), nil
}
