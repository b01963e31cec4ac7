package moe

import (
	"math"

	"github.com/moescope/moescope/moe/kernel"
)

// Flash-style causal attention with grouped KV heads and optional sliding
// window, as a GPU kernel runs it (Dao, FlashAttention-2, 2023, Algorithm 1
// and 2): forward keeps only the output O and the log-sum-exp of each score
// row; backward recomputes the probabilities tile by tile from Q, K and lse.
//
// For one sequence of s positions and one query head h (KV head h/(H/G)),
// with scale c = 1/√d and mask M(i,j) = [j ≤ i and (w = 0 or j > i − w)]:
//
//	S = c·Q·Kᵀ,  lse_i = log Σ_{j: M} exp(S_ij),  P_ij = M(i,j)·exp(S_ij − lse_i),  O = P·V
//
// Backward with D_i = Σ_e dO_ie·O_ie:
//
//	dV = Pᵀ·dO,  dP = dO·Vᵀ,  dS = P ⊙ (dP − D),  dQ = c·dS·K,  dK = c·dSᵀ·Q
//
// Work is tiled in Br×Bc blocks of (query, key) positions clipped to the
// sequence; a block with no unmasked entry is skipped, every other block is
// executed whole (masked entries computed and discarded). n = the area of
// the executed blocks; forward counts 2·n·d multiply-adds (QKᵀ and PV),
// backward 4·n·d (dP, dS·K, dSᵀ·Q, Pᵀ·dO) plus the recomputed QKᵀ, n·d,
// recorded as Recompute (moe/ops.go).

// attnShape is the geometry of one attention call.
type attnShape struct {
	batch, seq   int // sequences and positions per sequence
	heads, kv, d int // H, G, head dim
	window       int // 0 = full causal
	tileQ, tileK int // Br, Bc
	scale        float64
}

// tileLive reports whether the block of queries [i0,i1) and keys [j0,j1)
// holds an unmasked entry: some i in [i0,i1) with max(j0, i−w+1) ≤ min(j1−1, i).
func (a attnShape) tileLive(i0, i1, j0, j1 int) bool {
	lo, hi := max(i0, j0), i1-1
	if a.window > 0 {
		hi = min(hi, j1-1+a.window-1)
	}
	return lo <= hi
}

func (a attnShape) allowed(i, j int) bool {
	return j <= i && (a.window == 0 || j > i-a.window)
}

// area is n: the entries executed per sequence and head.
func (a attnShape) area() int64 {
	var n int64
	for i0 := 0; i0 < a.seq; i0 += a.tileQ {
		i1 := min(i0+a.tileQ, a.seq)
		for j0 := 0; j0 < a.seq; j0 += a.tileK {
			j1 := min(j0+a.tileK, a.seq)
			if a.tileLive(i0, i1, j0, j1) {
				n += int64(i1-i0) * int64(j1-j0)
			}
		}
	}
	return n
}

// attnFwd writes o [T, H·d] and lse [T, H] from q [T, H·d], k, v [T, G·d].
func attnFwd[T Float](o, lse, q, k, v []T, a attnShape) {
	H, G, d, s := a.heads, a.kv, a.d, a.seq
	rep := H / G
	c := T(a.scale)
	row := make([]T, a.tileK)
	m := make([]T, a.tileQ)
	l := make([]T, a.tileQ)
	for b := 0; b < a.batch; b++ {
		base := b * s
		for h := 0; h < H; h++ {
			g := h / rep
			for i0 := 0; i0 < s; i0 += a.tileQ {
				i1 := min(i0+a.tileQ, s)
				for i := i0; i < i1; i++ {
					m[i-i0], l[i-i0] = T(math.Inf(-1)), 0
					oi := o[((base+i)*H+h)*d:][:d]
					clear(oi)
				}
				for j0 := 0; j0 < s; j0 += a.tileK {
					j1 := min(j0+a.tileK, s)
					if !a.tileLive(i0, i1, j0, j1) {
						continue
					}
					for i := i0; i < i1; i++ {
						qi := q[((base+i)*H+h)*d:][:d]
						mx := T(math.Inf(-1))
						for j := j0; j < j1; j++ {
							kj := k[((base+j)*G+g)*d:][:d]
							var sc T
							for e, qv := range qi {
								sc += qv * kj[e]
							}
							sc *= c
							if !a.allowed(i, j) {
								sc = T(math.Inf(-1))
							}
							row[j-j0] = sc
							mx = max(mx, sc)
						}
						if math.IsInf(float64(mx), -1) {
							continue // every key of this block is masked for row i
						}
						mOld := m[i-i0]
						mNew := max(mOld, mx)
						alpha := exp(mOld - mNew)
						oi := o[((base+i)*H+h)*d:][:d]
						for e := range oi {
							oi[e] *= alpha
						}
						sum := l[i-i0] * alpha
						for j := j0; j < j1; j++ {
							p := exp(row[j-j0] - mNew)
							if math.IsInf(float64(row[j-j0]), -1) {
								p = 0
							}
							sum += p
							vj := v[((base+j)*G+g)*d:][:d]
							for e := range oi {
								oi[e] += p * vj[e]
							}
						}
						m[i-i0], l[i-i0] = mNew, sum
					}
				}
				for i := i0; i < i1; i++ {
					oi := o[((base+i)*H+h)*d:][:d]
					inv := 1 / l[i-i0]
					for e := range oi {
						oi[e] *= inv
					}
					lse[(base+i)*H+h] = m[i-i0] + T(math.Log(float64(l[i-i0])))
				}
			}
		}
	}
}

// attnBwd accumulates dq, dk, dv from do and the saved q, k, v, o, lse.
func attnBwd[T Float](dq, dk, dv, do, q, k, v, o, lse []T, a attnShape) {
	H, G, d, s := a.heads, a.kv, a.d, a.seq
	rep := H / G
	c := T(a.scale)
	D := make([]T, s)
	for b := 0; b < a.batch; b++ {
		base := b * s
		for h := 0; h < H; h++ {
			g := h / rep
			for i := 0; i < s; i++ {
				oi, doi := o[((base+i)*H+h)*d:][:d], do[((base+i)*H+h)*d:][:d]
				var t T
				for e := range oi {
					t += oi[e] * doi[e]
				}
				D[i] = t
			}
			for i0 := 0; i0 < s; i0 += a.tileQ {
				i1 := min(i0+a.tileQ, s)
				for j0 := 0; j0 < s; j0 += a.tileK {
					j1 := min(j0+a.tileK, s)
					if !a.tileLive(i0, i1, j0, j1) {
						continue
					}
					for i := i0; i < i1; i++ {
						qi := q[((base+i)*H+h)*d:][:d]
						doi := do[((base+i)*H+h)*d:][:d]
						dqi := dq[((base+i)*H+h)*d:][:d]
						li := lse[(base+i)*H+h]
						for j := j0; j < j1; j++ {
							kj := k[((base+j)*G+g)*d:][:d]
							vj := v[((base+j)*G+g)*d:][:d]
							var sc, dp T
							for e := range qi {
								sc += qi[e] * kj[e]
								dp += doi[e] * vj[e]
							}
							if !a.allowed(i, j) {
								continue
							}
							p := exp(sc*c - li)
							ds := p * (dp - D[i]) * c
							dkj := dk[((base+j)*G+g)*d:][:d]
							dvj := dv[((base+j)*G+g)*d:][:d]
							for e := range qi {
								dvj[e] += p * doi[e]
								dqi[e] += ds * kj[e]
								dkj[e] += ds * qi[e]
							}
						}
					}
				}
			}
		}
	}
}

// kernelShape is the same geometry for moe/kernel's float32 flash attention.
func (a attnShape) kernelShape() kernel.AttnShape {
	return kernel.AttnShape{Batch: a.batch, Seq: a.seq, Heads: a.heads, KVHeads: a.kv, HeadDim: a.d,
		Window: a.window, TileQ: a.tileQ, TileK: a.tileK}
}

// attention runs the forward through moe/kernel for float32 (same tiles,
// same executed area) and through attnFwd otherwise.
func attention[T Float](o, lse, q, k, v []T, a attnShape) {
	if o32, ok := any(o).([]float32); ok {
		kernel.AttentionForward(o32, any(lse).([]float32), any(q).([]float32), any(k).([]float32), any(v).([]float32), a.kernelShape())
		return
	}
	attnFwd(o, lse, q, k, v, a)
}

// attentionBack is attention's backward, dispatched the same way.
func attentionBack[T Float](dq, dk, dv, do, q, k, v, o, lse []T, a attnShape) {
	if dq32, ok := any(dq).([]float32); ok {
		f := func(x []T) []float32 { return any(x).([]float32) }
		kernel.AttentionBackward(dq32, f(dk), f(dv), f(do), f(q), f(k), f(v), f(o), f(lse), a.kernelShape())
		return
	}
	attnBwd(dq, dk, dv, do, q, k, v, o, lse, a)
}
