package parallel

import (
	"fmt"
	"math/rand/v2"

	"github.com/moescope/moescope/moe/job"
)

// Batch is the data plan of a run (DESIGN.md, Batch contract): LBS sequences
// of Seq tokens per data-parallel rank per micro-step, GradAccum micro-steps
// per optimizer step, DP = dp_replicate × dp_shard ranks. The global batch is
// B = LBS·DP·GradAccum sequences; step t consumes sequences [t·B, (t+1)·B).
type Batch struct {
	LBS, Seq, GradAccum, DP int
}

// Validate checks the batch by the run description's one set of limits
// (job.Batch.Validate), the data-parallel degree by a layout's
// (job.MaxDegree), and that the global batch stays far from overflowing
// the int64 sequence indices (2^40 sequences).
func (b Batch) Validate() error {
	if err := (job.Batch{LBS: b.LBS, Seq: b.Seq, GradAccum: b.GradAccum}).Validate(); err != nil {
		return err
	}
	if b.DP < 1 || b.DP > job.MaxDegree {
		return fmt.Errorf("dp = %d: must be in [1, %d]", b.DP, job.MaxDegree)
	}
	if int64(b.LBS)*int64(b.DP)*int64(b.GradAccum) > 1<<40 {
		return fmt.Errorf("global batch lbs %d × dp %d × grad_accum %d is too large", b.LBS, b.DP, b.GradAccum)
	}
	return nil
}

// Global is B = LBS·DP·GradAccum, sequences per step.
func (b Batch) Global() int64 { return int64(b.LBS) * int64(b.DP) * int64(b.GradAccum) }

// Start is the global index of the first of the LBS sequences that
// data-parallel rank r = replica·dp_shard + shard takes at micro-step m of
// step t: t·B + (m·DP + r)·LBS. N ranks at lbs l thus see exactly the
// micro-batches one rank sees at lbs l with grad-accum N·GradAccum, in the order
// (m, r).
func (b Batch) Start(t, m, r int) int64 {
	return int64(t)*b.Global() + (int64(m)*int64(b.DP)+int64(r))*int64(b.LBS)
}

// SyntheticSequence returns global sequence i of a deterministic synthetic
// corpus: n token ids in [0, vocab), a function of (seed, i) only, so every
// layout reads the same data. Each sequence follows a random affine rule
// x_{k+1} = (a·x_k + c) mod vocab, with one token in eight replaced by noise,
// so a model can lower its loss by learning the rule.
func SyntheticSequence(seed uint64, i int64, n, vocab int) []int32 {
	rng := rand.New(rand.NewPCG(seed, uint64(i)*0x9e3779b97f4a7c15+1))
	out := make([]int32, n)
	a := 1 + rng.IntN(3)
	c := rng.IntN(vocab)
	x := rng.IntN(vocab)
	for k := range out {
		if rng.IntN(8) == 0 {
			out[k] = int32(rng.IntN(vocab))
		} else {
			out[k] = int32(x)
		}
		x = (a*x + c) % vocab
	}
	return out
}

// Sequences returns the LBS sequences rank r reads at micro-step m of step
// t, each of Seq+1 ids: Seq inputs, and the labels are the inputs shifted by
// one (so a micro-batch predicts LBS·Seq positions).
func (b Batch) Sequences(seed uint64, vocab, t, m, r int) [][]int32 {
	start := b.Start(t, m, r)
	out := make([][]int32, b.LBS)
	for s := range out {
		out[s] = SyntheticSequence(seed, start+int64(s), b.Seq+1, vocab)
	}
	return out
}
