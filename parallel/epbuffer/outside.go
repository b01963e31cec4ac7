package epbuffer

import (
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// Outside is the memory outside PyTorch's allocator of a rank of run s on
// dev in NVLink domains of domain GPUs (< 1: those of the cluster dev is
// usually sold in, hw.ClusterForGPU): the device's (hw.Device.Outside) and,
// with ep > 1, DeepEP's Buffer (DeepEPBytes) or HybridEP's NVLink buffers
// (HybridEPBytes) for the rank's tokens of one micro-batch (its cp and tp
// share) and its local experts.
func Outside(dev hw.Device, s job.Spec, domain int) (int64, error) {
	l := s.Layout
	out := dev.Outside(l.EP)
	if l.EP <= 1 || s.Model == nil {
		return out, nil
	}
	switch s.Dispatcher {
	case job.DeepEP:
		b, err := DeepEPBytes(s.Model.Hidden, l.EP)
		return out + b, err
	case job.HybridEP:
		if domain < 1 {
			cl, err := hw.LoadCluster(hw.ClusterForGPU(dev.Name))
			if err != nil {
				return 0, err
			}
			domain = cl.NVLinkDomain
		}
		tokens := s.LBS * s.Seq / max(l.CPDegree()*l.TPDegree(), 1)
		b, err := HybridEPBytes(s.Model.Hidden, tokens, s.Model.Experts/l.EP, l.EP, domain)
		return out + b, err
	}
	return out, nil
}
