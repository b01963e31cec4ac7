package epbuffer

import (
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// Outside is the memory outside PyTorch's allocator of a rank of layout l
// on dev whose expert-parallel tokens, of hidden elements, move by
// dispatcher d: the device's (hw.Device.Outside) and, for DeepEP with
// ep > 1, its Buffer (DeepEPBytes) in place of the NCCL all-to-all's
// per-peer buffers. The device's OutsideEPBytes is what an all_to_all_single
// communicator's point-to-point connections add (NVIDIA/nccl issue #1685);
// NCCL connects a peer for send/recv only when the first send/recv to it is
// issued (NVIDIA/nccl issue #1691), and DeepEP moves tokens through its own
// NVLink and NVSHMEM buffers, so its expert-parallel group's communicator
// (used for the Buffer's set-up exchange, an all-gather) opens none. HybridEP's
// buffers are not counted yet: its source (DeepEP's hybrid-ep branch) is not
// read at a pinned commit, so a HybridEP rank keeps the all-to-all's.
func Outside(dev hw.Device, l job.Layout, d job.Dispatcher, hidden int) (int64, error) {
	if d != job.DeepEP || l.EP <= 1 {
		return dev.Outside(l.EP), nil
	}
	b, err := DeepEPBytes(hidden, l.EP)
	return dev.Outside(1) + b, err
}
