// Package host is the host memory a rank of the CPU reference needs: the
// memory model's peak at the reference's float32 storage, scaled to the
// resident memory of the process running it. train, grad and bench refuse
// runs by it.
package host

import (
	"fmt"
	"math/bits"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// HeapFactor scales memory.Estimate's peak allocated bytes of one rank of the CPU
// reference (every tensor in float32, moe.ReferencePrecision) to the
// resident memory of the process running it: the reference keeps working
// buffers the GPU accounting does not count, and Go's collector (GOGC=100)
// lets the heap grow past the live bytes. One factor serves every command
// that runs the reference on this CPU (train, grad, bench), erring high.
// Measured as the maximum resident set from /usr/bin/time ÷ the estimate:
//   - train, tiny model: 2 ranks at lbs 64 × seq 2048, 2.03 GiB ÷ 1.00 GiB;
//     1 rank at lbs 256 × seq 1024 with --ac full, 1.46 GiB ÷ 0.73 GiB;
//   - grad, tiny model, 500 sequences of 512 tokens, --ac none: 1.95 GB ÷
//     1.32 GB (×1.48);
//   - bench, qwen3-30b-a3b's layer with 16 experts, top-4, no
//     checkpointing: 2048 tokens, 1.97 GiB ÷ 1.94 GiB; 8192 tokens, 5.58
//     GiB ÷ 3.52 GiB (×1.59).
//
// The largest ratio, 2.03, rounds to 2.
const HeapFactor = 2.0

// Peak is the host memory, in bytes, that one rank of a CPU run of the
// reference needs at the peak of a step of b under ac on l: Estimate's peak
// allocated bytes at moe.ReferencePrecision (the reference's float32
// storage: training state and activations) × HeapFactor. The report is
// Estimate's, for a caller that sizes more of the run from it.
func Peak(cfg *moe.Config, l job.Layout, b memory.Batch, ac moe.AC) (float64, memory.Report, error) {
	r, err := memory.Estimate(cfg, l, b, memory.Options{Precision: moe.ReferencePrecision, AC: ac})
	if err != nil {
		return 0, memory.Report{}, err
	}
	return HeapFactor * float64(r.Peak.Allocated), r, nil
}

// GradParamBytes is the host memory `moescope grad` needs for the
// parameters alone: the reference's float32 values and gradients (8 bytes
// each) plus the float32 copy a checkpoint is loaded into (4 bytes),
// activations not included. A count that overflows is an error.
func GradParamBytes(cfg *moe.Config) (uint64, error) {
	var n uint64
	for _, p := range cfg.Params() {
		n += uint64(p.Elements())
	}
	hi, b := bits.Mul64(n, 12)
	if hi != 0 {
		return 0, fmt.Errorf("%s: parameter count %d overflows a byte count", cfg.Name, n)
	}
	return b, nil
}

// GradActivationBytes is the host memory grad's one batch of sequences ×
// seqLen tokens needs in the reference: Peak of one rank holding
// everything in float32 (ForwardBackwardHF runs sequences of seqLen inputs;
// the aux-loss passes add a label).
func GradActivationBytes(cfg *moe.Config, sequences, seqLen int, ac moe.AC) (float64, error) {
	l := job.Layout{GPUs: 1, Sharding: job.ShardDDP}
	if err := l.Resolve(); err != nil {
		return 0, err
	}
	need, _, err := Peak(cfg, l, memory.Batch{LBS: sequences, Seq: seqLen}, ac)
	if err != nil {
		return 0, fmt.Errorf("%d sequences × %d tokens: %v", sequences, seqLen, err)
	}
	return need, nil
}
