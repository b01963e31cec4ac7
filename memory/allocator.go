package memory

import "fmt"

// Allocator models PyTorch's CUDA caching allocator: how the bytes of live
// tensors (allocated) become bytes held from the device (reserved). Its
// parameters are data, so calibration can replace them.
//
// The model:
//   - every request is rounded up to RoundBytes (PyTorch kMinBlockSize = 512);
//     requests above SmallBytes are further rounded to SegmentBytes
//     (kRoundLarge = 2 MiB) because large blocks come from their own
//     cudaMalloc'd segments (c10/cuda/CUDACachingAllocator.cpp, constants
//     kMinBlockSize, kSmallSize = 1 MiB, kRoundLarge = 2 MiB);
//   - blocks are cached per stream: memory freed by a communication stream's
//     buffers cannot serve the compute stream, so the reserved peak is the
//     compute pool's peak plus the communication pool's peak (each over the
//     step), not the peak of their sum;
//   - what remains (blocks split and cached at sizes later requests cannot
//     use) is a fraction Fragmentation of the compute pool's peak.
//
// Reserved = (1 + Fragmentation) · peak(compute pool) + peak(comm pool).
type Allocator struct {
	RoundBytes    int64   // every request rounds up to a multiple of this
	SmallBytes    int64   // requests above this round up to SegmentBytes
	SegmentBytes  int64   // rounding of large requests
	Fragmentation float64 // fraction of the compute pool's peak lost to fragmentation
	// Source says where the numbers come from.
	Source string
}

// DefaultAllocator is PyTorch's rounding with a 5% fragmentation allowance.
// The rounding constants are from c10/cuda/CUDACachingAllocator.cpp
// (kMinBlockSize 512, kSmallSize 1 MiB, kRoundLarge 2 MiB). The 5% is an
// uncalibrated assumption, of the order of the gap between
// torch.cuda.max_memory_reserved and max_memory_allocated in torchtitan's
// published FSDP runs; `moescope calibrate` fits it to measurements.
var DefaultAllocator = Allocator{
	RoundBytes:    512,
	SmallBytes:    1 << 20,
	SegmentBytes:  2 << 20,
	Fragmentation: 0.05,
	Source:        "PyTorch c10/cuda/CUDACachingAllocator.cpp rounding; fragmentation 0.05 assumed, to calibrate",
}

// Validate checks the parameters.
func (a Allocator) Validate() error {
	if a.RoundBytes < 1 || a.SegmentBytes < a.RoundBytes || a.SmallBytes < 0 {
		return fmt.Errorf("allocator: round_bytes = %d, small_bytes = %d, segment_bytes = %d: need round ≥ 1, segment ≥ round, small ≥ 0",
			a.RoundBytes, a.SmallBytes, a.SegmentBytes)
	}
	if !(a.Fragmentation >= 0 && a.Fragmentation < 1) {
		return fmt.Errorf("allocator: fragmentation = %v: must be in [0, 1)", a.Fragmentation)
	}
	return nil
}

// Block is the size of the block a request of n bytes occupies.
func (a Allocator) Block(n int64) int64 {
	if n <= 0 {
		return 0
	}
	r := roundUp(n, a.RoundBytes)
	if r > a.SmallBytes {
		r = roundUp(r, a.SegmentBytes)
	}
	return r
}

func roundUp(n, m int64) int64 { return (n + m - 1) / m * m }

// Reserved turns the pools' peaks (of block sizes) into reserved bytes.
func (a Allocator) Reserved(computePeak, commPeak int64) int64 {
	return computePeak + int64(float64(computePeak)*a.Fragmentation) + commPeak
}
