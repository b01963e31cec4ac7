package ref

import (
	"math"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/attn"
	"github.com/moescope/moescope/moe/ref/rope"
	"github.com/moescope/moescope/moe/ref/scratch"
)

// LayerWeights holds the tensors of one decoder layer as flat row-major
// slices in Hugging Face's shapes ([out, in] for linear weights). Absent
// tensors (no bias, no QK-norm, dense instead of MoE, …) are nil. The same
// type carries gradients. An expert-parallel rank may leave ExpGate,
// ExpUp and ExpDown nil for experts it does not hold, as long as its
// ExpertStage never asks for them.
type LayerWeights[T Float] struct {
	AttnNorm, FFNNorm []T // [D]
	Wq, Bq            []T // [H·d, D], [H·d]
	Wk, Bk            []T // [G·d, D], [G·d]
	Wv, Bv            []T // [G·d, D], [G·d]
	Wo, Bo            []T // [D, H·d], [D]
	Sinks             []T // [H], GPT-OSS's per-head sink logits (gptoss.go)
	QNorm, KNorm      []T // [d] (per head) or [H·d], [G·d] (full width)
	// Multi-head latent attention (moe/mla.go; Wq is q_proj when there is no
	// query latent, Wo is [D, H·v]): q_a_proj [Rq, D], q_a_layernorm [Rq],
	// q_b_proj [H·(n+r), Rq], kv_a_proj_with_mqa [Rkv+r, D], kv_a_layernorm
	// [Rkv], kv_b_proj [H·(n+v), Rkv].
	WqA, QANorm, WqB, WkvA, KVANorm, WkvB []T

	Router, RouterBias []T // [E, D], [E]
	SelBias            []T // [E], selection bias (a buffer: no gradient)
	// Routed experts, indexed by global expert: [F, D], [F, D], [D, F],
	// and with Config.ExpertBias their biases [F], [F], [D].
	ExpGate, ExpUp, ExpDown             [][]T
	ExpGateBias, ExpUpBias, ExpDownBias [][]T
	// Fused experts (Config.FusedExperts, moe/fused.go) instead of ExpGate,
	// ExpUp and ExpDown: gate_up_proj [D, 2F] (gate and up interleaved),
	// its bias [2F] and down_proj [F, D], both input-major; ExpDownBias [D].
	ExpGateUp, ExpGateUpBias, ExpDownIn [][]T
	// Shared experts fused into one SwiGLU of width S = SharedExperts·SharedFFN.
	SharedGate, SharedUp, SharedDown []T // [S, D], [S, D], [D, S]
	SharedExpGate                    []T // [1, D] (Qwen2-MoE's σ gate)
	DenseGate, DenseUp, DenseDown    []T // [Fd, D], [Fd, D], [D, Fd]
}

// ExpertStage runs the routed experts of one MoE layer: the seam between
// dispatch and combine where expert parallelism exchanges rows by
// all-to-all. xTKD holds Σ counts = T·K rows of D elements in expert order
// (counts[e] rows for global expert e, e ascending, dropless); the result
// holds the expert outputs for the same rows in the same order. keep says
// whether Forward must keep what ExpertsBackward will read (false when the
// block, or under the modules policy's moe its MoE layer, is checkpointed
// and will call Forward again with pass Recompute before backward). ExpertsBackward receives the gradient of the rows of
// the last kept Forward of that layer, returns the gradient of xTKD and
// accumulates the experts' weight gradients. An implementation records its
// grouped GEMMs (expert_gate, expert_up, expert_down), expert_act and what
// it keeps, as the local one does. Under the modules policy's moe_act the
// local stage keeps the activation's inputs only (gate and up) and
// recomputes it at the start of ExpertsBackward.
type ExpertStage[T Float] interface {
	ExpertsForward(layer int, xTKD []T, counts []int, pass moe.Pass, keep bool) []T
	ExpertsBackward(layer int, dyTKD []T) []T
}

// blockState is what one block holds between its forward and backward.
// complete says it holds everything backward reads (policy none, or after
// recomputation); otherwise only x and the selective cache are held.
type blockState[T Float] struct {
	x, rstd1, h1             []T // block input [T,D], attn_norm rstd [T], normed [T,D]
	qRaw, qRstd, kRaw, kRstd []T // projections before QK-norm and the norms' rstd
	qPre, kPre               []T // l2_rope: the norm's input, q and k after RoPE
	q, k, v                  []T // attention inputs [T,q], [T,kv], [T,kv]
	mla                      mlaActs[T]
	ao                       []T // o_proj output [T,D]
	o, lse                   []T // attention output [T,q], log-sum-exp [T,H]
	x2, rstd2, h2            []T // mid residual, ffn_norm rstd, normed [T,D]
	rt                       *Routing[T]
	topValTK                 []T // top-k values [T,K] (before renormalization)
	expertOutTKD             []T // routed expert outputs [T·K, D], in expert order
	ffn                      ffnActs[T]
	gl, sGate                []T // shared_expert_gate logits and σ [T]
	fOut                     []T // shared or dense FFN output [T,D]
	cache                    map[moe.Op][]T
	complete                 bool
}

// Block runs one decoder layer: forward, checkpointing and backward. A
// Model owns one per layer; a parallel rank may build its own and drive it
// with weights it gathered. Forward and Backward alternate: Backward uses
// what the last Forward kept and releases it.
type Block[T Float] struct {
	cfg        *moe.Config
	layer      int
	batch, seq int
	x          *exec
	ac         moe.AC
	aux        bool
	rope       attn.Rope[T]
	temp       []float64 // Llama 4's query factor per position on a NoPE layer (nil: none)
	local      localExperts[T]
	// Experts, when non-nil, replaces the local execution of routed experts.
	Experts ExpertStage[T]
	// Attention, when non-nil, replaces the local attention (context
	// parallelism: AttentionStage).
	Attention AttentionStage[T]
	st        blockState[T]
	scratch   *scratch.Lease[T] // the step's buffers (model_block_scratch.go)
	// counts[e] = (token, slot) pairs routed to expert e in the last
	// forward; with the aux loss on, seqCounts[b·E+e] and seqScores[b·E+e]
	// = Σ_{t in sequence b} s_{t,e} per sequence (aux loss statistics).
	counts    []int
	seqCounts []int
	seqScores []T
}

// NewBlock returns the runner of decoder layer l for micro-batches of batch
// sequences of seq tokens.
func NewBlock[T Float](c *moe.Config, l, batch, seq int, o Options) *Block[T] {
	b := &Block[T]{cfg: c, layer: l, batch: batch, seq: seq, x: newExec(o), ac: o.AC, aux: o.AuxCoef != 0}
	b.scratch = scratch.NewPool[T]().Lease()
	b.rope = rope.Table[T](c, seq)
	b.temp = rope.Temperatures(c, l, seq, nil)
	b.local.b = b
	return b
}

// DeferWeightGrads makes the block's backwards queue their
// weight-gradient GEMMs on q (WeightQueue) until it is called with nil:
// the local experts' and every linear's. An ExpertStage replacing the
// local experts is handed q when it has a DeferWeightGrads(*WeightQueue)
// method (numeric's expert-parallel stage: it then queues its experts'
// GEMMs on q too); one without runs its backward whole.
func (b *Block[T]) DeferWeightGrads(q *WeightQueue) {
	b.scratch.Forget() // a queued GEMM may read what is lent now
	b.x.wq = q
	if s, ok := b.Experts.(interface{ DeferWeightGrads(*WeightQueue) }); ok {
		s.DeferWeightGrads(q)
	}
}

// Routing returns the routing the block holds (nil for dense layers, and
// between forward and backward when the block or its MoE layer is
// checkpointed).
func (b *Block[T]) Routing() *Routing[T] { return b.st.rt }

// ExpertCounts returns the per-expert (token, slot) counts of the last
// forward (nil for dense layers).
func (b *Block[T]) ExpertCounts() []int { return b.counts }

func (b *Block[T]) tokens() int { return b.batch * b.seq }

func (b *Block[T]) attnShape() attn.Shape {
	c := b.cfg
	scale := c.AttnScale
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(c.HeadDim))
	}
	return attn.Shape{Batch: b.batch, Seq: b.seq, Heads: c.Heads, KV: c.KVHeads, D: c.HeadDim, DV: c.VHeadDim(),
		Window: c.Window[b.layer], Chunk: c.LayerChunk(b.layer), TileQ: b.x.tileQ, TileK: b.x.tileK, Scale: scale}
}

// lin runs a linear op unless the cache (selective, memory budget) holds its output.
func (b *Block[T]) lin(op moe.Op, pass moe.Pass, useCache bool, in, w, bias []T, m, n, k int) []T {
	if useCache {
		if y, ok := b.st.cache[op]; ok {
			return y
		}
	}
	y := b.buf(m * n)
	linear(b.x, b.layer, op, pass, y, in, w, bias, m, n, k)
	return y
}

// Forward runs the block on x [T,D] (T = batch·seq tokens) and returns its
// output; it keeps for backward what the checkpointing policy says.
func (b *Block[T]) Forward(w *LayerWeights[T], x []T) []T {
	if len(x) != b.tokens()*b.cfg.Hidden {
		panic("moe: Block.Forward needs x of batch·seq·hidden elements")
	}
	b.scratch.Release()
	b.st = blockState[T]{x: x}
	b.local.w = w
	out := b.forward(w, moe.Forward, false)
	b.keep()
	b.retainKept()
	return out
}

// forward computes the block from b.st.x, filling b.st. useCache takes the
// selective cache's outputs instead of recomputing those ops.
func (b *Block[T]) forward(w *LayerWeights[T], pass moe.Pass, useCache bool) []T {
	c, st, ex, L := b.cfg, &b.st, b.x, b.layer
	T_, D, H := b.tokens(), c.Hidden, c.Heads
	t64 := int64(T_)

	st.h1, st.rstd1 = b.buf(T_*D), b.buf(T_)
	rmsNormFwd(st.h1, st.rstd1, st.x, w.AttnNorm, D, c.NormEps)
	ex.round(st.h1)
	ex.op(L, moe.OpAttnNorm, pass, t64*int64(D))

	if c.IsMLA() {
		b.mlaForward(w, pass, useCache)
	} else {
		b.qkvForward(w, pass, useCache)
	}
	b.attend(w, pass, useCache)
	st.ao = b.lin(moe.OpOProj, pass, useCache, st.o, w.Wo, w.Bo, T_, D, H*c.VHeadDim())

	st.x2 = b.buf(T_ * D)
	addInto(st.x2, st.x, st.ao)
	ex.round(st.x2)
	st.h2, st.rstd2 = b.buf(T_*D), b.buf(T_)
	rmsNormFwd(st.h2, st.rstd2, st.x2, w.FFNNorm, D, c.NormEps)
	ex.round(st.h2)
	ex.op(L, moe.OpFFNNorm, pass, t64*int64(D))

	y := b.buf(T_ * D)
	if c.MoELayer[L] {
		b.moeForward(w, y, pass, useCache)
	} else {
		st.ffn = newFFNActs(T_, c.DenseFFN, b.buf)
		st.fOut = b.swiglu(&st.ffn, pass, useCache, moe.OpDenseGate, moe.OpDenseUp, moe.OpDenseAct, moe.OpDenseDown,
			w.DenseGate, w.DenseUp, w.DenseDown, c.DenseFFN)
		copy(y, st.fOut)
	}
	out := b.outBuf(pass, T_*D)
	addInto(out, st.x2, y)
	ex.round(out)
	ex.op(L, moe.OpResidual, pass, 2*t64*int64(D))
	st.complete = true
	return out
}

// qkvForward computes the attention inputs q, k, v of a standard block
// from the normed input h1: projections, QK-norm and RoPE.
func (b *Block[T]) qkvForward(w *LayerWeights[T], pass moe.Pass, useCache bool) {
	c, st, ex, L := b.cfg, &b.st, b.x, b.layer
	T_, D, H, G, d := b.tokens(), c.Hidden, c.Heads, c.KVHeads, c.HeadDim
	q, kv := H*d, G*d
	t64 := int64(T_)
	st.qRaw = b.lin(moe.OpQProj, pass, useCache, st.h1, w.Wq, w.Bq, T_, q, D)
	st.kRaw = b.lin(moe.OpKProj, pass, useCache, st.h1, w.Wk, w.Bk, T_, kv, D)
	st.v = b.lin(moe.OpVProj, pass, useCache, st.h1, w.Wv, w.Bv, T_, kv, D)

	st.q, st.k = b.buf(T_*q), b.buf(T_*kv)
	switch c.QKNorm {
	case moe.QKNormHead, moe.QKNormFull:
		wq, wk := d, d
		if c.QKNorm == moe.QKNormFull {
			wq, wk = q, kv
		}
		st.qRstd, st.kRstd = b.buf(T_*q/wq), b.buf(T_*kv/wk)
		rmsNormFwd(st.q, st.qRstd, st.qRaw, w.QNorm, wq, c.NormEps)
		rmsNormFwd(st.k, st.kRstd, st.kRaw, w.KNorm, wk, c.NormEps)
		ex.round(st.q)
		ex.round(st.k)
		ex.op(L, moe.OpQNorm, pass, t64*int64(q))
		ex.op(L, moe.OpKNorm, pass, t64*int64(kv))
	default:
		copy(st.q, st.qRaw)
		copy(st.k, st.kRaw)
	}
	if c.Roped(L) { // Llama 4's NoPE layers rotate nothing
		b.rope.Apply(st.q, H, d, b.seq, false)
		b.rope.Apply(st.k, G, d, b.seq, false)
		ex.round(st.q)
		ex.round(st.k)
		ex.op(L, moe.OpRoPE, pass, t64*int64(H+G)*int64(c.RotaryDim()))
	}
	if c.QKNorm == moe.QKNormL2Rope && c.LayerQKNorm(L) {
		st.qPre, st.kPre = st.q, st.k
		st.q, st.k, st.qRstd, st.kRstd = b.buf(T_*q), b.buf(T_*kv), b.buf(T_*H), b.buf(T_*G)
		attn.L2NormForward(st.q, st.qRstd, st.qPre, d, c.NormEps)
		attn.L2NormForward(st.k, st.kRstd, st.kPre, d, c.NormEps)
		ex.round(st.q)
		ex.round(st.k)
		ex.op(L, moe.OpQNorm, pass, t64*int64(q))
		ex.op(L, moe.OpKNorm, pass, t64*int64(kv))
	}
	if b.temp != nil { // no op record: flops counts none (docs/llama4.md)
		attn.ScaleQueries(st.q, q, b.temp)
		ex.round(st.q)
	}
}

// attend runs attention on q, k, v (or takes the selective cache's output),
// with w's sinks when it has them.
func (b *Block[T]) attend(w *LayerWeights[T], pass moe.Pass, useCache bool) {
	c, st, L := b.cfg, &b.st, b.layer
	T_, H := b.tokens(), c.Heads
	a := b.attnShape()
	if o, ok := st.cache[moe.OpAttn]; useCache && ok {
		st.o, st.lse = o, st.cache[opLSE]
		return
	}
	st.o, st.lse = b.buf(T_*H*a.DV), b.buf(T_*H)
	area := int64(b.batch) * a.Area()
	if b.Attention != nil {
		area = b.Attention.AttentionForward(L, st.o, st.lse, st.q, st.k, st.v, a)
	} else {
		attn.Forward(st.o, st.lse, st.q, st.k, st.v, a)
	}
	if w.Sinks != nil {
		attn.SinksForward(st.o, st.lse, w.Sinks, a)
	}
	b.x.round(st.o)
	b.x.op(L, moe.OpAttn, pass, int64(H)*area*int64(a.D+a.DV))
}

// swiglu runs a shared or dense SwiGLU on h2 and returns its output [T,D].
func (b *Block[T]) swiglu(s *ffnActs[T], pass moe.Pass, useCache bool, opG, opU, opA, opD moe.Op, wg, wu, wd []T, f int) []T {
	T_, D := b.tokens(), b.cfg.Hidden
	s.g = b.lin(opG, pass, useCache, b.st.h2, wg, nil, T_, f, D)
	s.u = b.lin(opU, pass, useCache, b.st.h2, wu, nil, T_, f, D)
	swigluAct(*s)
	b.x.round(s.sg)
	b.x.round(s.a)
	b.x.op(b.layer, opA, pass, int64(T_)*int64(f))
	return b.lin(opD, pass, useCache, s.a, wd, nil, T_, D, f)
}
