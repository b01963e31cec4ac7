// Package attn is the reference implementation's flash-style causal
// attention for float32 and float64: grouped KV heads, sliding windows and
// Llama 4's chunks, tiling whose executed area is what moe records, and
// value heads whose width may differ from the query·key width (multi-head
// latent attention); and what prepares its inputs: the RoPE rotation,
// Llama 4's weightless L2 QK-norm and its queries' temperature.
package attn

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
// with scale c = 1/√d and mask M(i,j) = [j ≤ i and (w = 0 or j > i − w)],
// or under Chunk = C > 0 M(i,j) = [j ≤ i and ⌊j/C⌋ = ⌊i/C⌋] (Llama 4's
// chunked attention, create_chunked_causal_mask in transformers 000c33fd):
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

// Shape is the geometry of one attention call.
type Shape struct {
	Batch, Seq   int // sequences and positions per sequence
	Heads, KV, D int // H, G, q·k head dim
	// DV is the value (and output) head dim; 0 means D.
	DV           int
	Window       int     // 0 = full causal
	Chunk        int     // 0 = none; C: keys of the query's own chunk of C (not with Window)
	TileQ, TileK int     // Br, Bc
	Scale        float64 // softmax scale of q·k
}

// tileLive reports whether the block of queries [i0,i1) and keys [j0,j1)
// holds an unmasked entry: some i in [i0,i1) with max(j0, i−w+1) ≤ min(j1−1, i);
// under a chunk, some i whose chunk's first key ⌊i/C⌋·C is < j1 and i ≥ j0,
// which the smallest such i, max(i0, j0), decides (first keys grow with i).
func (a Shape) tileLive(i0, i1, j0, j1 int) bool {
	lo, hi := max(i0, j0), i1-1
	if a.Window > 0 {
		hi = min(hi, j1-1+a.Window-1)
	}
	if a.Chunk > 0 && lo <= hi {
		return lo/a.Chunk*a.Chunk < j1
	}
	return lo <= hi
}

func (a Shape) allowed(i, j int) bool {
	return j <= i && (a.Window == 0 || j > i-a.Window) && (a.Chunk == 0 || j/a.Chunk == i/a.Chunk)
}

// Area is n: the entries executed per sequence and head.
func (a Shape) Area() int64 {
	var n int64
	for i0 := 0; i0 < a.Seq; i0 += a.TileQ {
		i1 := min(i0+a.TileQ, a.Seq)
		for j0 := 0; j0 < a.Seq; j0 += a.TileK {
			j1 := min(j0+a.TileK, a.Seq)
			if a.tileLive(i0, i1, j0, j1) {
				n += int64(i1-i0) * int64(j1-j0)
			}
		}
	}
	return n
}

// fwd writes o [T, H·d] and lse [T, H] from q [T, H·d], k, v [T, G·d].
func fwd[T Float](o, lse, q, k, v []T, a Shape) {
	H, G, d, s := a.Heads, a.KV, a.D, a.Seq
	rep := H / G
	c := T(a.Scale)
	row := make([]T, a.TileK)
	m := make([]T, a.TileQ)
	l := make([]T, a.TileQ)
	for b := 0; b < a.Batch; b++ {
		base := b * s
		for h := 0; h < H; h++ {
			g := h / rep
			for i0 := 0; i0 < s; i0 += a.TileQ {
				i1 := min(i0+a.TileQ, s)
				for i := i0; i < i1; i++ {
					m[i-i0], l[i-i0] = T(math.Inf(-1)), 0
					oi := o[((base+i)*H+h)*d:][:d]
					clear(oi)
				}
				for j0 := 0; j0 < s; j0 += a.TileK {
					j1 := min(j0+a.TileK, s)
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

// bwd accumulates dq, dk, dv from do and the saved q, k, v, o, lse.
func bwd[T Float](dq, dk, dv, do, q, k, v, o, lse []T, a Shape) {
	H, G, d, s := a.Heads, a.KV, a.D, a.Seq
	rep := H / G
	c := T(a.Scale)
	D := make([]T, s)
	for b := 0; b < a.Batch; b++ {
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
			for i0 := 0; i0 < s; i0 += a.TileQ {
				i1 := min(i0+a.TileQ, s)
				for j0 := 0; j0 < s; j0 += a.TileK {
					j1 := min(j0+a.TileK, s)
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
func (a Shape) kernelShape() kernel.AttnShape {
	return kernel.AttnShape{Batch: a.Batch, Seq: a.Seq, Heads: a.Heads, KVHeads: a.KV, HeadDim: a.D,
		Window: a.Window, Chunk: a.Chunk, TileQ: a.TileQ, TileK: a.TileK}
}

// forward runs the forward through moe/kernel for float32 (same tiles,
// same executed area) and through fwd otherwise; q, k, v share the head
// dim a.D and the scale is 1/√a.D on the kernel path.
func forward[T Float](o, lse, q, k, v []T, a Shape) {
	if o32, ok := any(o).([]float32); ok {
		kernel.AttentionForward(o32, any(lse).([]float32), any(q).([]float32), any(k).([]float32), any(v).([]float32), a.kernelShape())
		return
	}
	fwd(o, lse, q, k, v, a)
}

// backward is forward's backward, dispatched the same way.
func backward[T Float](dq, dk, dv, do, q, k, v, o, lse []T, a Shape) {
	if dq32, ok := any(dq).([]float32); ok {
		f := func(x []T) []float32 { return any(x).([]float32) }
		kernel.AttentionBackward(dq32, f(dk), f(dv), f(do), f(q), f(k), f(v), f(o), f(lse), a.kernelShape())
		return
	}
	bwd(dq, dk, dv, do, q, k, v, o, lse, a)
}

// Float is the element type of the reference implementation.
type Float interface{ ~float32 | ~float64 }

func exp[T Float](x T) T { return T(math.Exp(float64(x))) }

// direct reports whether the kernels run the shape as it is: one head dim
// for q, k and v, and the scale 1/√D the float32 kernel applies.
func (a Shape) direct() bool {
	return (a.DV == 0 || a.DV == a.D) && a.Scale == 1/math.Sqrt(float64(a.D))
}

// padded is the shape the kernels run when a is not direct: every head
// zero-padded to P = max(D, DV) dims (as transformers pads v for flash
// attention when MLA's widths differ), scale 1/√P, the queries
// pre-multiplied by Scale·√P so that the scores are Scale·q·k. Zero dims
// change no score, and the padded output columns are P·0 = 0.
func (a Shape) padded() (p Shape, qMul float64) {
	p = a
	p.D, p.DV = max(a.D, a.DV), 0
	p.Scale = 1 / math.Sqrt(float64(p.D))
	return p, a.Scale * math.Sqrt(float64(p.D))
}

// pad copies x [rows, heads·w] into [rows, heads·P], times mul.
func pad[T Float](x []T, heads, w, P int, mul T) []T {
	rows := len(x) / (heads * w)
	y := make([]T, rows*heads*P)
	for r := 0; r < rows*heads; r++ {
		for e, v := range x[r*w : r*w+w] {
			y[r*P+e] = v * mul
		}
	}
	return y
}

// unpadAdd adds the first w of every P dims of y [rows, heads·P], times
// mul, to x [rows, heads·w].
func unpadAdd[T Float](x, y []T, heads, w, P int, mul T) {
	for r := 0; r < len(x)/w; r++ {
		for e := range x[r*w : r*w+w] {
			x[r*w+e] += y[r*P+e] * mul
		}
	}
}

// Forward writes o [T, H·DV] and lse [T, H] from q [T, H·D], k [T, G·D]
// and v [T, G·DV] (T = Batch·Seq rows).
func Forward[T Float](o, lse, q, k, v []T, a Shape) {
	if a.direct() {
		forward(o, lse, q, k, v, a)
		return
	}
	p, mul := a.padded()
	dv := a.vDim()
	op := make([]T, len(o)/dv*p.D)
	forward(op, lse, pad(q, a.Heads, a.D, p.D, T(mul)), pad(k, a.KV, a.D, p.D, 1), pad(v, a.KV, dv, p.D, 1), p)
	clear(o)
	unpadAdd(o, op, a.Heads, dv, p.D, 1)
}

// Backward accumulates dq, dk, dv from do [T, H·DV] and the saved q, k, v,
// o and lse.
func Backward[T Float](dq, dk, dv, do, q, k, v, o, lse []T, a Shape) {
	if a.direct() {
		backward(dq, dk, dv, do, q, k, v, o, lse, a)
		return
	}
	p, mul := a.padded()
	w := a.vDim()
	dqp, dkp, dvp := make([]T, len(q)/a.D*p.D), make([]T, len(k)/a.D*p.D), make([]T, len(v)/w*p.D)
	backward(dqp, dkp, dvp, pad(do, a.Heads, w, p.D, 1), pad(q, a.Heads, a.D, p.D, T(mul)), pad(k, a.KV, a.D, p.D, 1),
		pad(v, a.KV, w, p.D, 1), pad(o, a.Heads, w, p.D, 1), lse, p)
	unpadAdd(dq, dqp, a.Heads, a.D, p.D, T(mul))
	unpadAdd(dk, dkp, a.KV, a.D, p.D, 1)
	unpadAdd(dv, dvp, a.KV, w, p.D, 1)
}

// vDim is the value head dim.
func (a Shape) vDim() int {
	if a.DV == 0 {
		return a.D
	}
	return a.DV
}
