package epbuffer

import (
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// Outside is the memory outside PyTorch's allocator of a rank of layout l
// on dev whose expert-parallel tokens, of hidden elements, move by
// dispatcher d: the device's (hw.Device.Outside) and, for DeepEP with
// ep > 1, its Buffer (DeepEPBytes). HybridEP's buffers are not counted
// yet: its source (DeepEP's hybrid-ep branch) is not read at a pinned
// commit.
func Outside(dev hw.Device, l job.Layout, d job.Dispatcher, hidden int) (int64, error) {
	out := dev.Outside(l.EP)
	if d != job.DeepEP || l.EP <= 1 {
		return out, nil
	}
	b, err := DeepEPBytes(hidden, l.EP)
	return out + b, err
}
