package ref

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/quant"
	"slices"
)

// Options control one forward/backward execution of the reference model.
type Options struct {
	// AC is the activation-checkpointing policy (zero value: none).
	AC moe.AC
	// Recorder receives every op run and every tensor kept for backward;
	// nil records nothing and costs nothing.
	Recorder moe.Recorder
	// Precision gives the storage types reported for kept tensors; the zero
	// value means DefaultPrecision. It changes records, not arithmetic.
	Precision moe.Precision
	// BF16 rounds the weights used by forward and backward and every
	// activation an op writes to bfloat16, as a GPU under torchtitan's mixed
	// precision stores them (router scores, weights, log-sum-exp and the
	// loss stay in float32 arithmetic, as there). Gradients are not rounded.
	BF16 bool
	// AuxCoef multiplies the aux loss added to the training loss (AuxLoss:
	// HF's load_balancing_loss_func, or DeepSeek-MoE's with
	// Config.SeqAuxLoss); 0 neither computes nor records it. HFAuxCoef is
	// the coefficient HF trains with.
	AuxCoef float64
	// TileQ×TileK is the attention block (Br×Bc); 0 means 128 (a GPU
	// flash-attention block). 1×1 executes exactly the unmasked entries.
	TileQ, TileK int
	// Quantize, when set, fake-quantises the GEMMs a low-precision recipe
	// converts, so that each multiplies, in float32, exactly the values the
	// recipe's FP8 or FP4 GEMM multiplies (float32 models only); nil runs
	// every GEMM in full.
	Quantize *quant.GEMMs
	// Progress, when set, is called after each block's forward and
	// backward with the blocks done and the total (2 × layers with a
	// backward, layers without): a long CPU run says how far it is.
	Progress func(done, total int)
}

// exec is the per-call context every op reports through.
type exec struct {
	rec          moe.Recorder
	act          moe.DType // activation storage type
	bf16         bool
	tileQ, tileK int
	wq           *WeightQueue // when set, weight-gradient GEMMs are queued (WeightQueue)
	q            *quant.GEMMs // fake quantisation of converted GEMMs, or nil
}

// WeightQueue holds weight-gradient GEMMs deferred from a backward: a
// Block or Head given one (DeferWeightGrads) computes each linear's and
// grouped GEMM's input gradient at once and queues the weight gradient,
// with copies of the input and output gradient it reads, so that Run
// computes them later, in order: the backward-input / backward-weight
// split of zero-bubble pipeline schedules. The norms' scale gradients
// and the embedding's are not deferred; records are emitted when queued.
type WeightQueue struct{ fns []func() }

// Run computes the queued weight gradients, in order, and empties q.
func (q *WeightQueue) Run() {
	for _, f := range q.fns {
		f()
	}
	q.fns = nil
}

// Do queues f, the weight-gradient half of a backward, behind what is
// queued, or runs it now when q is nil (weight gradients not deferred):
// the one place that choice is made, for this package's ops and for
// stages outside it (numeric's expert-parallel stage).
func (q *WeightQueue) Do(f func()) {
	if q == nil {
		f()
		return
	}
	q.fns = append(q.fns, f)
}

// Len is the number of queued weight-gradient GEMMs.
func (q *WeightQueue) Len() int { return len(q.fns) }

// weightPass runs f, the weight-gradient half of a backward op, now, or
// queues it when weight gradients are deferred.
func (x *exec) weightPass(f func()) { x.wq.Do(f) }

func newExec(o Options) *exec {
	p := o.Precision
	if p == (moe.Precision{}) {
		p = moe.DefaultPrecision
	}
	x := &exec{rec: o.Recorder, act: p.Activation, bf16: o.BF16, tileQ: o.TileQ, tileK: o.TileK, q: o.Quantize}
	if x.tileQ <= 0 {
		x.tileQ = 128
	}
	if x.tileK <= 0 {
		x.tileK = 128
	}
	return x
}

func (x *exec) op(layer int, op moe.Op, pass moe.Pass, count int64) {
	if x.rec != nil {
		x.rec.RecordOp(moe.OpRecord{Layer: layer, Op: op, Pass: pass, Count: count})
	}
}

func (x *exec) saved(layer int, op moe.Op, tensor moe.Saved, elements int, dt moe.DType) {
	if x.rec != nil {
		x.rec.RecordSaved(moe.SavedRecord{Layer: layer, Op: op, Tensor: tensor, Elements: int64(elements), DType: dt})
	}
}

// linear runs y = x·Wᵀ (+ b) over m rows and records it.
func linear[T Float](x *exec, layer int, op moe.Op, pass moe.Pass, y, in, w, b []T, m, n, k int) {
	qin, qw := quantPair(x.q, op, layer, gemmForward, in, w, m, n, k)
	linearFwd(y, qin, qw, m, n, k)
	if b != nil {
		for i := 0; i < m; i++ {
			yi := y[i*n : i*n+n]
			for j := range yi {
				yi[j] += b[j]
			}
		}
	}
	x.round(y)
	x.op(layer, op, pass, int64(m)*int64(n)*int64(k))
}

// linearBack accumulates dx (when non-nil), dW and db (when non-nil).
func linearBack[T Float](x *exec, layer int, op moe.Op, dx, dw, db, dy, in, w []T, m, n, k int) {
	mnk := int64(m) * int64(n) * int64(k)
	if dx != nil {
		qdy, qw := quantPair(x.q, op, layer, gemmDataGrad, dy, w, m, n, k)
		linearBwdX(dx, qdy, qw, m, n, k)
		x.op(layer, op, moe.BackwardData, mnk)
	}
	if x.wq != nil { // the caller may reuse both before the queue runs
		dy, in = slices.Clone(dy), slices.Clone(in)
	}
	x.weightPass(func() {
		qdy, qin := quantPair(x.q, op, layer, gemmWeightGrad, dy, in, m, n, k)
		linearBwdW(dw, qdy, qin, m, n, k)
		if db != nil {
			for i := 0; i < m; i++ {
				for j, v := range dy[i*n : i*n+n] {
					db[j] += v
				}
			}
		}
	})
	x.op(layer, op, moe.BackwardWeight, mnk)
}

func (x *exec) round(v any) {
	if !x.bf16 {
		return
	}
	switch s := v.(type) {
	case []float32:
		roundBF16(s)
	case []float64:
		roundBF16(s)
	}
}
