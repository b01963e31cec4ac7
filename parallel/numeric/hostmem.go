package numeric

import (
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/memory/host"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// HostMemory is what a numeric run of Trainer needs of this machine's
// memory, in bytes, by term. The memory accounting (package memory) models
// a GPU rank; these terms model the CPU reference the goroutine ranks run,
// every tensor in float32.
type HostMemory struct {
	Parameters int64 // the model's parameter count
	// Params: every rank holds a float32 copy of the model and its
	// gradients to run its blocks on, plus its shards of parameters,
	// gradients and two moments.
	Params float64
	// Activations: each rank's activations grow with lbs·seq:
	// host.Peak of one rank (memory.Estimate's peak allocated bytes
	// in float32, the reference's storage type, times host.HeapFactor),
	// on every rank.
	Activations float64
	// Padding: gathered weights, and the gradients reduce-scattered from
	// them, are padded as FSDP2 pads them: a tensor of r rows on n ranks
	// takes ⌈r/n⌉·n rows, so with more ranks than rows every rank's float32
	// buffers grow with the world (total ∝ world²). Σ shard × dp_shard
	// bounds a rank's padded elements (experts shard over dp_shard/ep).
	Padding float64
}

// Total is the sum of the terms.
func (h HostMemory) Total() float64 { return h.Params + h.Activations + h.Padding }

// PaddedCopies is how many padded float32 copies of the model a numeric
// rank holds besides what the other terms count (gathered weights,
// reduce-scatter inputs, collective buffers). Measured on the tiny model at
// lbs 1 × seq 8, whose padding dominates at many ranks (maximum resident
// set from /usr/bin/time against the total with one copy): 256 ranks 0.38
// GiB vs 0.31; 512 ranks 0.99 vs 1.01; 1024 ranks 3.40 vs 3.58 (4096 ranks
// were killed for memory at 24 GiB).
const PaddedCopies = 1.0

// EstimateHostMemory sizes a numeric run of cfg on l's world of ranks. The
// Params term (and Parameters) is filled even when the activation estimate
// fails, so a caller can refuse an oversized model first.
func EstimateHostMemory(cfg *moe.Config, l job.Layout, b memory.Batch, ac moe.AC) (HostMemory, error) {
	var h HostMemory
	for _, p := range cfg.Params() {
		h.Parameters += p.Elements()
	}
	world := float64(l.GPUs)
	h.Params = float64(h.Parameters) * 4 * (2*world + 6)
	rank, est, err := host.Peak(cfg, l, b, ac)
	if err != nil {
		return h, err
	}
	h.Activations = rank * world
	var padded int64
	for _, u := range est.Units {
		padded += u.Shard * int64(l.DPShard)
	}
	h.Padding = PaddedCopies * 4 * float64(padded) * world
	return h, nil
}
