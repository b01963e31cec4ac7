package ref

import "github.com/moescope/moescope/moe"

// The reference implementation of an MLA block's attention inputs (moe/mla.go
// gives the maths): forward from the normed input h1 to q, k, v, and its
// backward from their gradients to h1's.

// mlaActs is what an MLA block computes on the way to q, k and v.
type mlaActs[T Float] struct {
	qa, qaRstd, qan []T // q_a_proj output [T,Rq], its norm's rstd [T], normed [T,Rq]
	ckv             []T // kv_a_proj_with_mqa output [T, Rkv+r]
	lat, latRstd    []T // its first Rkv columns [T,Rkv] and their norm's rstd [T]
	latn            []T // normed latent [T,Rkv], kv_b_proj's input
	kvb             []T // kv_b_proj output [T, H·(n+v)]
}

// mlaForward computes q [T, H·(n+r)], k [T, H·(n+r)] and v [T, H·v] from
// h1: queries through q_proj or q_a_proj, RMSNorm and q_b_proj; the latent
// c = kv_a_proj(h1), whose first Rkv columns are normed and expanded by
// kv_b_proj into each head's k_nope and v, and whose last r columns are the
// one rotated key every head shares. RoPE rotates each head's last r dims.
func (b *Block[T]) mlaForward(w *LayerWeights[T], pass moe.Pass, useCache bool) {
	c, st, ex, L := b.cfg, &b.st, b.x, b.layer
	m, a := c.MLA, &b.st.mla
	T_, D, H, dqk := b.tokens(), c.Hidden, c.Heads, c.HeadDim
	t64, r, nv := int64(T_), m.Rope, m.Nope+m.V
	if m.QRank == 0 {
		st.qRaw = b.lin(moe.OpQProj, pass, useCache, st.h1, w.Wq, nil, T_, H*dqk, D)
	} else {
		a.qa = b.lin(moe.OpQAProj, pass, useCache, st.h1, w.WqA, nil, T_, m.QRank, D)
		a.qan, a.qaRstd = b.buf(T_*m.QRank), b.buf(T_)
		rmsNormFwd(a.qan, a.qaRstd, a.qa, w.QANorm, m.QRank, m.NormEps)
		ex.round(a.qan)
		ex.op(L, moe.OpQANorm, pass, t64*int64(m.QRank))
		st.qRaw = b.lin(moe.OpQBProj, pass, useCache, a.qan, w.WqB, nil, T_, H*dqk, m.QRank)
	}
	a.ckv = b.lin(moe.OpKVAProj, pass, useCache, st.h1, w.WkvA, nil, T_, m.KVRank+r, D)
	a.lat, a.latn, a.latRstd = b.buf(T_*m.KVRank), b.buf(T_*m.KVRank), b.buf(T_)
	kPe := b.buf(T_ * r)
	for t := 0; t < T_; t++ {
		row := a.ckv[t*(m.KVRank+r):][:m.KVRank+r]
		copy(a.lat[t*m.KVRank:][:m.KVRank], row[:m.KVRank])
		copy(kPe[t*r:][:r], row[m.KVRank:])
	}
	rmsNormFwd(a.latn, a.latRstd, a.lat, w.KVANorm, m.KVRank, m.NormEps)
	ex.round(a.latn)
	ex.op(L, moe.OpKVANorm, pass, t64*int64(m.KVRank))
	a.kvb = b.lin(moe.OpKVBProj, pass, useCache, a.latn, w.WkvB, nil, T_, H*nv, m.KVRank)

	st.q = append([]T(nil), st.qRaw...)
	b.rope.ApplyAt(st.q, H, dqk, m.Nope, b.seq, false)
	b.rope.ApplyAt(kPe, 1, r, 0, b.seq, false)
	st.k, st.v = b.buf(T_*H*dqk), b.buf(T_*H*m.V)
	for t := 0; t < T_; t++ {
		for h := 0; h < H; h++ {
			kvh, kh := a.kvb[(t*H+h)*nv:][:nv], st.k[(t*H+h)*dqk:][:dqk]
			copy(kh[:m.Nope], kvh[:m.Nope])
			copy(kh[m.Nope:], kPe[t*r:][:r])
			copy(st.v[(t*H+h)*m.V:][:m.V], kvh[m.Nope:])
		}
	}
	ex.round(st.q)
	ex.round(st.k)
	ex.op(L, moe.OpRoPE, pass, t64*int64(H+1)*int64(r))
}

// mlaBackward accumulates into dh1 the gradient of the normed input from
// dq, dk, dv (mlaForward in reverse) and the weights' gradients into g.
func (b *Block[T]) mlaBackward(w, g *LayerWeights[T], dh1, dq, dk, dv []T) {
	c, st, ex, L := b.cfg, &b.st, b.x, b.layer
	m, a := c.MLA, &b.st.mla
	T_, D, H, dqk := b.tokens(), c.Hidden, c.Heads, c.HeadDim
	t64, r, nv := int64(T_), m.Rope, m.Nope+m.V
	// k's rotated part is one key shared by every head: its gradient sums.
	dkvb, dkPe := b.buf(T_*H*nv), b.buf(T_*r)
	for t := 0; t < T_; t++ {
		for h := 0; h < H; h++ {
			dkvh, dkh := dkvb[(t*H+h)*nv:][:nv], dk[(t*H+h)*dqk:][:dqk]
			copy(dkvh[:m.Nope], dkh[:m.Nope])
			copy(dkvh[m.Nope:], dv[(t*H+h)*m.V:][:m.V])
			for e, v := range dkh[m.Nope:] {
				dkPe[t*r+e] += v
			}
		}
	}
	b.rope.ApplyAt(dq, H, dqk, m.Nope, b.seq, true)
	b.rope.ApplyAt(dkPe, 1, r, 0, b.seq, true)
	ex.op(L, moe.OpRoPE, moe.BackwardData, t64*int64(H+1)*int64(r))

	dlatn, dlat := b.buf(T_*m.KVRank), b.buf(T_*m.KVRank)
	linearBack(ex, L, moe.OpKVBProj, dlatn, g.WkvB, nil, dkvb, a.latn, w.WkvB, T_, H*nv, m.KVRank)
	rmsNormBwd(dlat, g.KVANorm, dlatn, a.lat, a.latRstd, w.KVANorm, m.KVRank)
	ex.op(L, moe.OpKVANorm, moe.BackwardData, t64*int64(m.KVRank))
	ex.op(L, moe.OpKVANorm, moe.BackwardWeight, t64*int64(m.KVRank))
	dckv := b.buf(T_ * (m.KVRank + r))
	for t := 0; t < T_; t++ {
		row := dckv[t*(m.KVRank+r):][:m.KVRank+r]
		copy(row[:m.KVRank], dlat[t*m.KVRank:][:m.KVRank])
		copy(row[m.KVRank:], dkPe[t*r:][:r])
	}
	linearBack(ex, L, moe.OpKVAProj, dh1, g.WkvA, nil, dckv, st.h1, w.WkvA, T_, m.KVRank+r, D)
	if m.QRank == 0 {
		linearBack(ex, L, moe.OpQProj, dh1, g.Wq, nil, dq, st.h1, w.Wq, T_, H*dqk, D)
		return
	}
	dqan, dqa := b.buf(T_*m.QRank), b.buf(T_*m.QRank)
	linearBack(ex, L, moe.OpQBProj, dqan, g.WqB, nil, dq, a.qan, w.WqB, T_, H*dqk, m.QRank)
	rmsNormBwd(dqa, g.QANorm, dqan, a.qa, a.qaRstd, w.QANorm, m.QRank)
	ex.op(L, moe.OpQANorm, moe.BackwardData, t64*int64(m.QRank))
	ex.op(L, moe.OpQANorm, moe.BackwardWeight, t64*int64(m.QRank))
	linearBack(ex, L, moe.OpQAProj, dh1, g.WqA, nil, dqa, st.h1, w.WqA, T_, m.QRank, D)
}

// mlaRecord reports what an MLA block keeps for the backward of its
// attention inputs, in moe/saved.go's mlaAttention order.
func (b *Block[T]) mlaRecord(rec func(moe.Op, moe.Saved, []T, moe.DType)) {
	st, a, act := &b.st, &b.st.mla, b.x.act
	if b.cfg.MLA.QRank == 0 {
		rec(moe.OpQProj, moe.SavedInput, st.h1, act)
	} else {
		rec(moe.OpQAProj, moe.SavedInput, st.h1, act)
		rec(moe.OpQANorm, moe.SavedInput, a.qa, act)
		rec(moe.OpQANorm, moe.SavedRstd, a.qaRstd, moe.F32)
		rec(moe.OpQBProj, moe.SavedInput, a.qan, act)
	}
	rec(moe.OpKVANorm, moe.SavedInput, a.lat, act)
	rec(moe.OpKVANorm, moe.SavedRstd, a.latRstd, moe.F32)
	rec(moe.OpKVBProj, moe.SavedInput, a.latn, act)
}

// mlaViews takes an MLA layer's attention tensors from next in Params order
// (mlaParams).
func mlaViews[T Float](c *moe.Config, lw *LayerWeights[T], next func(int) []T) {
	m, D, H := c.MLA, c.Hidden, c.Heads
	qk := H * c.HeadDim
	if m.QRank == 0 {
		lw.Wq = next(qk * D)
	} else {
		lw.WqA, lw.QANorm, lw.WqB = next(m.QRank*D), next(m.QRank), next(qk*m.QRank)
	}
	lw.WkvA, lw.KVANorm, lw.WkvB = next((m.KVRank+m.Rope)*D), next(m.KVRank), next(H*(m.Nope+m.V)*m.KVRank)
	lw.Wo = next(D * H * m.V)
}
