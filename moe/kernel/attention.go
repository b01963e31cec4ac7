package kernel

import (
	"math"
	"sync"
)

// Flash-style attention (Dao, "FlashAttention-2", 2023, Algorithms 1 and 2)
// for float32 on the CPU.
//
// Layout, for Batch sequences of Seq positions (T = Batch·Seq rows,
// position i of sequence b is row b·Seq+i): q and o are T×(H·d), k and v
// T×(G·d), head h occupying columns [h·d, (h+1)·d); lse is T×H. Query head
// h reads KV head h/(H/G) (grouped-query attention). With scale c = 1/√d and
// mask M(i,j) = [i − w < j ≤ i] (w = Window; w = 0 means full causal), or
// with Chunk = C > 0 M(i,j) = [⌊i/C⌋·C ≤ j ≤ i] (Llama 4's chunked
// attention: a query sees the keys of its own chunk up to itself):
//
//	S = c·Q·Kᵀ,  lse_i = log Σ_{j: M(i,j)} exp(S_ij),  P_ij = M(i,j)·exp(S_ij − lse_i),  O = P·V
//
// Backward, with D_i = Σ_e dO_ie·O_ie:
//
//	dV = Pᵀ·dO,  dP = dO·Vᵀ,  dS = P ⊙ (dP − D),  dQ = c·dS·K,  dK = c·dSᵀ·Q
//
// The work is tiled in TileQ×TileK blocks of (query, key) positions (default
// AttnTileQ×AttnTileK), clipped to the sequence. A block without an unmasked entry is skipped;
// every other block is computed whole, its masked entries discarded. So per
// sequence and query head the forward performs n·d multiply-adds for QKᵀ and
// n·d for PV, n = AttnShape.Area(); the backward recomputes QKᵀ
// (n·d) and does four more products (4·n·d). Forward keeps only O and lse;
// backward recomputes P from Q, K and lse.

// The default tile: AttnTileQ query positions by AttnTileK key positions,
// a GPU flash-attention block and the reference model's default. On the CPU
// 128×128 ran 20% faster than 64×64 (fewer packings per multiply-add).
const (
	AttnTileQ = 128
	AttnTileK = 128
)

// AttnShape is the geometry of one attention call.
type AttnShape struct {
	Batch, Seq int // sequences, positions per sequence
	Heads      int // H query heads
	KVHeads    int // G key/value heads; divides Heads
	HeadDim    int // d
	Window     int // sliding window w (keys i−w < j ≤ i); 0 = full causal
	Chunk      int // chunk C (keys ⌊i/C⌋·C ≤ j ≤ i); 0 = none; not with Window
	// TileQ×TileK is the block the work is tiled in; 0 means AttnTileQ,
	// AttnTileK. Any size is correct; 1×1 executes exactly the unmasked
	// entries (and runs slowly).
	TileQ, TileK int
}

// tiles returns the tile sizes in use.
func (a AttnShape) tiles() (tq, tk int) {
	tq, tk = a.TileQ, a.TileK
	if tq <= 0 {
		tq = AttnTileQ
	}
	if tk <= 0 {
		tk = AttnTileK
	}
	return tq, tk
}

// check panics with a constant message on an impossible shape or short
// slices (a programming error).
func (a AttnShape) check(q, k, v, o, lse []float32) {
	if a.Batch < 0 || a.Seq < 0 || a.Heads <= 0 || a.KVHeads <= 0 || a.HeadDim <= 0 || a.Window < 0 || a.Chunk < 0 || a.Heads%a.KVHeads != 0 || a.TileQ < 0 || a.TileK < 0 {
		panic("kernel: attention: need Heads, KVHeads, HeadDim > 0, KVHeads dividing Heads, Batch, Seq, Window, tiles ≥ 0")
	}
	t := a.Batch * a.Seq
	if len(q) < t*a.Heads*a.HeadDim || len(o) < t*a.Heads*a.HeadDim || len(lse) < t*a.Heads ||
		len(k) < t*a.KVHeads*a.HeadDim || len(v) < t*a.KVHeads*a.HeadDim {
		panic("kernel: attention: slice shorter than its shape")
	}
}

// keyTiles returns the key-tile range [j0, j1) (tile starts, in positions)
// that query tile [i0, i1) must visit: a tile runs iff some query in it sees
// some key in it. Every key tile from the first key the first query sees
// (i0−w+1, or the start of i0's chunk ⌊i0/C⌋·C) to the tile holding the
// last query (i1−1) qualifies: a key j ≥ i0 is seen by query j, a key j < i0
// from there on by query i0 (the first keys seen never decrease with i).
func (a AttnShape) keyTiles(i0, i1 int) (j0, j1 int) {
	lo := a.firstKey(i0)
	_, tk := a.tiles()
	return lo / tk * tk, i1
}

// firstKey is the first key query i sees.
func (a AttnShape) firstKey(i int) int {
	switch {
	case a.Window > 0:
		return max(0, i-a.Window+1)
	case a.Chunk > 0:
		return i / a.Chunk * a.Chunk
	}
	return 0
}

// Area is n, the score entries the kernel executes per sequence and query
// head: the area of every TileQ×TileK tile, clipped to the sequence, that
// holds an unmasked entry. Batch, heads and head size do not enter.
func (a AttnShape) Area() int64 {
	tq, tk := a.tiles()
	var n int64
	for i0 := 0; i0 < a.Seq; i0 += tq {
		i1 := min(i0+tq, a.Seq)
		j0, j1 := a.keyTiles(i0, i1)
		for ; j0 < j1; j0 += tk {
			n += int64(i1-i0) * int64(min(j0+tk, a.Seq)-j0)
		}
	}
	return n
}

// visibleKeys returns the keys [lo, hi) of [j0, j1) that query i sees
// (lo ≥ hi when none).
func (a AttnShape) visibleKeys(i, j0, j1 int) (lo, hi int) {
	return max(j0, a.firstKey(i)), min(j1, i+1)
}

// AttentionForward writes o and lse from q, k, v (layout in the file
// comment). Query tiles of every KV head run in parallel over Threads()
// cores.
func AttentionForward(o, lse, q, k, v []float32, a AttnShape) {
	a.check(q, k, v, o, lse)
	if a.Batch*a.Seq == 0 {
		return
	}
	c := attnCalls.Get().(*attnCall)
	*c = attnCall{shape: a, q: q, k: k, v: v, o: o, lse: lse}
	tq, _ := a.tiles()
	tiles := (a.Seq + tq - 1) / tq
	parallel(a.Batch*a.KVHeads*tiles, c)
	*c = attnCall{}
	attnCalls.Put(c)
}

// AttentionBackward accumulates the gradients dq, dk, dv (same layouts as q,
// k, v) from do and the forward's q, k, v, o, lse. KV heads of every
// sequence run in parallel over Threads() cores.
func AttentionBackward(dq, dk, dv, do, q, k, v, o, lse []float32, a AttnShape) {
	a.check(q, k, v, o, lse)
	a.check(dq, dk, dv, do, lse)
	if a.Batch*a.Seq == 0 {
		return
	}
	c := attnCalls.Get().(*attnCall)
	*c = attnCall{shape: a, backward: true, q: q, k: k, v: v, o: o, lse: lse, dq: dq, dk: dk, dv: dv, do: do}
	parallel(a.Batch*a.KVHeads, c)
	*c = attnCall{}
	attnCalls.Put(c)
}

type attnCall struct {
	shape           AttnShape
	backward        bool
	q, k, v, o, lse []float32
	dq, dk, dv, do  []float32
}

var attnCalls = sync.Pool{New: func() any { return new(attnCall) }}

func (c *attnCall) task(ar *arena, t int) {
	if c.backward {
		c.bwd(ar, t)
		return
	}
	c.fwd(ar, t)
}

// Arena scratch slots used by attention.
const (
	slotS    = iota // scores / probabilities: one stack × Bc (forward), Br×Bc (backward)
	slotDP          // forward: row max and rescale of a stack; backward: Br×Bc dP / dS
	slotO           // output accumulators
	slotStat        // running max and sum
	slotD           // D_i = Σ dO·O per query
	slotQ           // packed Q (A panels)
	slotDO          // packed dO (A panels)
	slotK           // packed K_j (B panel of Kᵀ)
	slotV           // packed V_j (B panel)
	slotKn          // packed K_j as B (for dQ = dS·K)
	slotAp          // packed P or dS as A
	slotDQ          // dQ accumulators of the task
	slotDKV         // dK_j, dV_j accumulators of one key tile
	slotQB          // packed Q_i as B (for dK = dSᵀ·Q), every query tile of the task
	slotDOB         // packed dO_i as B (for dV = Pᵀ·dO), every query tile of the task
	slotRows        // one stack's rows of Q, contiguous, before packing
)

// stackHeads is how many of a KV head's query heads one forward product
// stacks: their rows of a query tile are one operand of hb·Br rows
// (head-major), so S = Q·Kᵀ and O += P·V pad to the micro-kernel's mr once
// per stack instead of once per head (128 rows are 10⅔ slivers of 12).
// Every output element is the same sum in the same order as unstacked, so
// the results keep their bits. It is the largest divisor of rep with at
// most maxStackRows rows: a stack's scores, packed P and output
// accumulators are then 512 KiB each at most. The backward does not stack:
// there dK and dV would reduce over the stacked rows in one call, a
// different rounding, which moved the losses `train` prints under expert
// parallelism (TestTrainPipelineLosses) against the one-rank run.
func stackHeads(rep, tq int) int {
	const maxStackRows = 1024
	hb := 1
	for n := 1; n <= rep; n++ {
		if rep%n == 0 && n*tq <= maxStackRows {
			hb = n
		}
	}
	return hb
}

// stackRows copies rows [i0, i1) of query heads h0 … h0+hb−1 of x (rows
// ld apart, head h at column h·d) into dst head-major: row r·(i1−i0)+i is
// position i0+i of head h0+r.
func stackRows(dst, x []float32, ld, d, h0, hb, i0, i1 int) {
	br := i1 - i0
	for r := range hb {
		for i := range br {
			copy(dst[(r*br+i)*d:][:d], x[(i0+i)*ld+(h0+r)*d:][:d])
		}
	}
}

// fwd runs query tile it of KV head g of sequence b, t = (tiles−1−it)·B·G
// + b·G + g (the last query tiles, which see the most keys, are handed out
// first, so the call's idle tail is at most a short tile), for all H/G
// query heads sharing the head, stacked hb at a time
// (stackHeads): K_j and V_j are packed once per key tile for all of them,
// the Q tiles once per task.
func (c *attnCall) fwd(ar *arena, t int) {
	a := c.shape
	H, G, d, s := a.Heads, a.KVHeads, a.HeadDim, a.Seq
	tq, tk := a.tiles()
	mk := active()
	mr, nr := mk.mr, mk.nr
	tiles := (s + tq - 1) / tq
	it, bg := tiles-1-t/(a.Batch*G), t%(a.Batch*G)
	b, g := bg/G, bg%G
	rep := H / G
	hb := stackHeads(rep, tq)
	i0, i1 := it*tq, min((it+1)*tq, s)
	br := i1 - i0
	m := hb * br // rows of one stack: r·br + i is query i0+i of its head r
	mp := roundUp(m, mr)
	scale := float32(1 / math.Sqrt(float64(d)))
	ldq, ldk := H*d, G*d
	kv := (b*s*G + g) * d // K, V rows of this sequence and head: kv + j·ldk

	Qc := ar.scratch(slotRows, m*d)
	Qp := ar.scratch(slotQ, rep/hb*mp*d) // stack st at st·mp·d
	for st := range rep / hb {
		stackRows(Qc, c.q[b*s*ldq:], ldq, d, g*rep+st*hb, hb, i0, i1)
		packA(Qp[st*mp*d:], false, Qc, d, 0, 0, m, d, mr, scale)
	}
	O := ar.scratch(slotO, rep*br*d) // row q = r·br + i: query i0+i of head g·rep+r
	clear(O)
	stat := ar.scratch(slotStat, 2*rep*br)
	mx, l := stat[:rep*br], stat[rep*br:]
	for i := range mx {
		mx[i], l[i] = float32(math.Inf(-1)), 0
	}
	S := ar.scratch(slotS, m*tk)
	rows := ar.scratch(slotDP, 2*m)
	mNew, alpha := rows[:m], rows[m:]
	Pp := ar.scratch(slotAp, mp*tk)
	Kp := ar.scratch(slotK, roundUp(tk, nr)*d)
	Vp := ar.scratch(slotV, tk*roundUp(d, nr))
	jStart, jEnd := a.keyTiles(i0, i1)
	for j0 := jStart; j0 < jEnd; j0 += tk {
		j1 := min(j0+tk, s)
		bc := j1 - j0
		packB(Kp, true, c.k[kv:], ldk, 0, j0, d, bc, nr)  // Kᵀ: d × bc
		packB(Vp, false, c.v[kv:], ldk, j0, 0, bc, d, nr) // V: bc × d
		for st := range rep / hb {
			macro(ar, mk, d, m, bc, Qp[st*mp*d:], Kp, S, bc, false) // S = c·Q·Kᵀ
			// Per row: new running max m, rescale factor exp(old − m) (one
			// vector exp over the rows), probabilities exp(S − m).
			for R := 0; R < m; R++ {
				row := S[R*bc : R*bc+bc]
				q := st*m + R
				lo, hi := a.visibleKeys(i0+R%br, j0, j1)
				if lo >= hi { // nothing visible to this query in this tile
					clear(row)
					mNew[R], alpha[R] = mx[q], 0 // exp(0) = 1: unchanged
					continue
				}
				for j := j0; j < lo; j++ {
					row[j-j0] = float32(math.Inf(-1))
				}
				for j := hi; j < j1; j++ {
					row[j-j0] = float32(math.Inf(-1))
				}
				mNew[R] = maxRow(row[lo-j0:hi-j0], mx[q])
				alpha[R] = mx[q] - mNew[R] // −∞ while mx[q] is: exp gives 0
			}
			expSubSumRow(alpha, 0)
			for R := 0; R < m; R++ {
				q := st*m + R
				if lo, hi := a.visibleKeys(i0+R%br, j0, j1); lo >= hi {
					continue // row cleared above, state unchanged
				}
				row := S[R*bc : R*bc+bc]
				sum := expSubSumRow(row, mNew[R])
				mx[q], l[q] = mNew[R], l[q]*alpha[R]+sum
				if alpha[R] != 1 {
					scaleRow(O[q*d:q*d+d], alpha[R])
				}
			}
			packA(Pp, false, S, bc, 0, 0, m, bc, mr, 1)
			macro(ar, mk, bc, m, d, Pp, Vp, O[st*m*d:], d, true) // O += P·V
		}
	}
	for r := range rep {
		h := g*rep + r
		for i := 0; i < br; i++ {
			q := r*br + i
			oi := c.o[((b*s+i0+i)*H+h)*d:][:d]
			inv := 1 / l[q]
			for e, x := range O[q*d : q*d+d] {
				oi[e] = x * inv
			}
			c.lse[(b*s+i0+i)*H+h] = mx[q] + float32(math.Log(float64(l[q])))
		}
	}
}

// bwd runs the backward of KV head t%G of sequence t/G: for every key tile
// (K_j, V_j packed once), every query head of the group and every query tile
// that sees it. Q and dO of the group are packed once per task, as A (for
// the scores and dP) and as B (for dK and dV; packed per key tile instead,
// copying them was 10% of the backward's CPU time). dQ, dK_j and
// dV_j accumulate in contiguous buffers (rows d apart: the strided rows of
// dq, H·d apart, alias in L1) and are added to dq, dk, dv once.
func (c *attnCall) bwd(ar *arena, t int) {
	a := c.shape
	H, G, d, s := a.Heads, a.KVHeads, a.HeadDim, a.Seq
	b, g := t/G, t%G
	rep := H / G
	tq, tk := a.tiles()
	mk := active()
	mr, nr := mk.mr, mk.nr
	tiles := (s + tq - 1) / tq
	brp := roundUp(tq, mr)
	scale := float32(1 / math.Sqrt(float64(d)))
	ldq, ldk := H*d, G*d
	kv := (b*s*G + g) * d

	D := ar.scratch(slotD, rep*s)
	Qa := ar.scratch(slotQ, rep*tiles*brp*d)
	dOa := ar.scratch(slotDO, rep*tiles*brp*d)
	dn := roundUp(d, nr)
	Qb := ar.scratch(slotQB, rep*tiles*tq*dn) // head r, query tile it at (r·tiles+it)·tq·dn
	dOb := ar.scratch(slotDOB, rep*tiles*tq*dn)
	for r := range rep {
		h := g*rep + r
		for i := 0; i < s; i++ {
			o := ((b*s+i)*H + h) * d
			D[r*s+i] = dotRow(c.o[o:o+d], c.do[o:o+d])
		}
		for it := range tiles {
			i0, i1 := it*tq, min((it+1)*tq, s)
			off := (r*tiles + it) * brp * d
			packA(Qa[off:], false, c.q[(b*s*H+h)*d:], ldq, i0, 0, i1-i0, d, mr, scale)
			packA(dOa[off:], false, c.do[(b*s*H+h)*d:], ldq, i0, 0, i1-i0, d, mr, 1)
			off = (r*tiles + it) * tq * dn
			packB(Qb[off:], false, c.q[(b*s*H+h)*d:], ldq, i0, 0, i1-i0, d, nr)
			packB(dOb[off:], false, c.do[(b*s*H+h)*d:], ldq, i0, 0, i1-i0, d, nr)
		}
	}
	P := ar.scratch(slotS, tq*tk)
	dS := ar.scratch(slotDP, tq*tk)
	Kt := ar.scratch(slotK, roundUp(tk, nr)*d)
	Vt := ar.scratch(slotV, roundUp(tk, nr)*d)
	Kn := ar.scratch(slotKn, tk*roundUp(d, nr))
	Ap := ar.scratch(slotAp, max(roundUp(tk, mr)*tq, roundUp(tq, mr)*tk))
	dQ := ar.scratch(slotDQ, rep*tiles*tq*d) // head r, query tile it at (r·tiles+it)·tq·d
	clear(dQ)
	dKV := ar.scratch(slotDKV, 2*tk*d)
	dkt, dvt := dKV[:tk*d], dKV[tk*d:]
	for j0 := 0; j0 < s; j0 += tk {
		j1 := min(j0+tk, s)
		bc := j1 - j0
		packB(Kt, true, c.k[kv:], ldk, 0, j0, d, bc, nr)  // Kᵀ: d × bc
		packB(Vt, true, c.v[kv:], ldk, 0, j0, d, bc, nr)  // Vᵀ: d × bc
		packB(Kn, false, c.k[kv:], ldk, j0, 0, bc, d, nr) // K: bc × d
		clear(dKV)
		for r := range rep {
			h := g*rep + r
			for it := range tiles {
				i0, i1 := it*tq, min((it+1)*tq, s)
				if js, je := a.keyTiles(i0, i1); j0 < js || j0 >= je {
					continue
				}
				br := i1 - i0
				off := (r*tiles + it) * brp * d
				macro(ar, mk, d, br, bc, Qa[off:], Kt, P, bc, false)   // S = c·Q·Kᵀ
				macro(ar, mk, d, br, bc, dOa[off:], Vt, dS, bc, false) // dP = dO·Vᵀ
				for i := 0; i < br; i++ {
					row := P[i*bc : i*bc+bc]
					lo, hi := a.visibleKeys(i0+i, j0, j1)
					lo = min(lo, j1) - j0
					hi = max(hi-j0, lo)
					expSubSumRow(row[lo:hi], c.lse[(b*s+i0+i)*H+h])
					clear(row[:lo])
					clear(row[hi:])
					dsRow(dS[i*bc:i*bc+bc], row, D[r*s+i0+i], scale) // dS·c
				}
				boff := (r*tiles + it) * tq * dn
				packA(Ap, true, P, bc, 0, 0, bc, br, mr, 1)            // Pᵀ: bc × br
				macro(ar, mk, br, bc, d, Ap, dOb[boff:], dvt, d, true) // dV_j += Pᵀ·dO_i
				packA(Ap, true, dS, bc, 0, 0, bc, br, mr, 1)           // dSᵀ
				macro(ar, mk, br, bc, d, Ap, Qb[boff:], dkt, d, true)  // dK_j += c·dSᵀ·Q_i
				packA(Ap, false, dS, bc, 0, 0, br, bc, mr, 1)
				macro(ar, mk, bc, br, d, Ap, Kn, dQ[(r*tiles+it)*tq*d:], d, true) // dQ_i += c·dS·K_j
			}
		}
		for j := 0; j < bc; j++ {
			addRow(c.dk[kv+(j0+j)*ldk:][:d], dkt[j*d:j*d+d])
			addRow(c.dv[kv+(j0+j)*ldk:][:d], dvt[j*d:j*d+d])
		}
	}
	for r := range rep {
		qh := (b*s*H + g*rep + r) * d
		for i := 0; i < s; i++ {
			it := i / tq
			addRow(c.dq[qh+i*ldq:][:d], dQ[((r*tiles+it)*tq+i-it*tq)*d:][:d])
		}
	}
}

// addRow sets dst[j] += src[j].
func addRow(dst, src []float32) {
	src = src[:len(dst)]
	for j, v := range src {
		dst[j] += v
	}
}
