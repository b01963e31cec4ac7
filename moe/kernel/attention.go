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
// mask M(i,j) = [i − w < j ≤ i] (w = Window; w = 0 means full causal):
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
	if a.Batch < 0 || a.Seq < 0 || a.Heads <= 0 || a.KVHeads <= 0 || a.HeadDim <= 0 || a.Window < 0 || a.Heads%a.KVHeads != 0 || a.TileQ < 0 || a.TileK < 0 {
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
// (i0−w+1) to the tile holding the last query (i1−1) qualifies.
func (a AttnShape) keyTiles(i0, i1 int) (j0, j1 int) {
	lo := 0
	if a.Window > 0 {
		lo = max(0, i0-a.Window+1)
	}
	_, tk := a.tiles()
	return lo / tk * tk, i1
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
	lo, hi = j0, min(j1, i+1)
	if a.Window > 0 {
		lo = max(lo, i-a.Window+1)
	}
	return lo, hi
}

// visible reports M(i, j).
func (a AttnShape) visible(i, j int) bool { return j <= i && (a.Window == 0 || j > i-a.Window) }

// AttentionForward writes o and lse from q, k, v (layout in the file
// comment). Query tiles of every head run in parallel over Threads() cores.
func AttentionForward(o, lse, q, k, v []float32, a AttnShape) {
	a.check(q, k, v, o, lse)
	if a.Batch*a.Seq == 0 {
		return
	}
	c := attnCalls.Get().(*attnCall)
	*c = attnCall{shape: a, q: q, k: k, v: v, o: o, lse: lse}
	tq, _ := a.tiles()
	tiles := (a.Seq + tq - 1) / tq
	parallel(a.Batch*a.Heads*tiles, c)
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
	slotS    = iota // Br×Bc scores / probabilities
	slotDP          // Br×Bc dP / dS
	slotO           // Br×d output accumulator
	slotStat        // 2·Br running max and sum, or the D vector
)

// fwd runs query tile t = ((b·H)+h)·tiles + it.
func (c *attnCall) fwd(ar *arena, t int) {
	a := c.shape
	H, G, d, s := a.Heads, a.KVHeads, a.HeadDim, a.Seq
	tq, tk := a.tiles()
	tiles := (s + tq - 1) / tq
	it, bh := t%tiles, t/tiles
	b, h := bh/H, bh%H
	g := h / (H / G)
	i0, i1 := it*tq, min((it+1)*tq, s)
	br := i1 - i0
	scale := float32(1 / math.Sqrt(float64(d)))
	ldq, ldk := H*d, G*d
	qt := c.q[((b*s+i0)*H+h)*d:]
	S := ar.scratch(slotS, tq*tk)
	O := ar.scratch(slotO, tq*d)
	stat := ar.scratch(slotStat, 2*tq)
	mx, l := stat[:br], stat[tq:tq+br]
	clear(O[:br*d])
	for i := range mx {
		mx[i], l[i] = float32(math.Inf(-1)), 0
	}
	jStart, jEnd := a.keyTiles(i0, i1)
	for j0 := jStart; j0 < jEnd; j0 += tk {
		j1 := min(j0+tk, s)
		bc := j1 - j0
		kt := c.k[((b*s+j0)*G+g)*d:]
		vt := c.v[((b*s+j0)*G+g)*d:]
		sgemmSeq(ar, false, true, br, bc, d, scale, qt, ldq, kt, ldk, 0, S, bc)
		for i := 0; i < br; i++ {
			row := S[i*bc : i*bc+bc]
			lo, hi := a.visibleKeys(i0+i, j0, j1)
			if lo >= hi { // nothing visible to query i0+i in this tile
				clear(row)
				continue
			}
			for j := j0; j < lo; j++ {
				row[j-j0] = float32(math.Inf(-1))
			}
			for j := hi; j < j1; j++ {
				row[j-j0] = float32(math.Inf(-1))
			}
			m := maxRow(row[lo-j0:hi-j0], mx[i])
			alpha := expf(mx[i] - m) // 0 while mx[i] is still −∞
			sum := expSubSumRow(row, m)
			mx[i], l[i] = m, l[i]*alpha+sum
			if alpha != 1 {
				scaleRow(O[i*d:i*d+d], alpha)
			}
		}
		sgemmSeq(ar, false, false, br, d, bc, 1, S, bc, vt, ldk, 1, O, d)
	}
	for i := 0; i < br; i++ {
		oi := c.o[((b*s+i0+i)*H+h)*d:][:d]
		inv := 1 / l[i]
		for e, x := range O[i*d : i*d+d] {
			oi[e] = x * inv
		}
		c.lse[(b*s+i0+i)*H+h] = mx[i] + float32(math.Log(float64(l[i])))
	}
}

// bwd runs the backward of KV head t%G of sequence t/G: every query head of
// the group, every query tile, every key tile it visits.
func (c *attnCall) bwd(ar *arena, t int) {
	a := c.shape
	H, G, d, s := a.Heads, a.KVHeads, a.HeadDim, a.Seq
	b, g := t/G, t%G
	rep := H / G
	tq, tk := a.tiles()
	scale := float32(1 / math.Sqrt(float64(d)))
	ldq, ldk := H*d, G*d
	P := ar.scratch(slotS, tq*tk)
	dS := ar.scratch(slotDP, tq*tk)
	D := ar.scratch(slotStat, s)
	for h := g * rep; h < (g+1)*rep; h++ {
		for i := 0; i < s; i++ {
			r := ((b*s+i)*H + h) * d
			D[i] = dotRow(c.o[r:r+d], c.do[r:r+d])
		}
		for i0 := 0; i0 < s; i0 += tq {
			i1 := min(i0+tq, s)
			br := i1 - i0
			qt := c.q[((b*s+i0)*H+h)*d:]
			dot := c.do[((b*s+i0)*H+h)*d:]
			dqt := c.dq[((b*s+i0)*H+h)*d:]
			jStart, jEnd := a.keyTiles(i0, i1)
			for j0 := jStart; j0 < jEnd; j0 += tk {
				j1 := min(j0+tk, s)
				bc := j1 - j0
				off := ((b*s+j0)*G + g) * d
				kt, vt := c.k[off:], c.v[off:]
				dkt, dvt := c.dk[off:], c.dv[off:]
				sgemmSeq(ar, false, true, br, bc, d, scale, qt, ldq, kt, ldk, 0, P, bc)
				sgemmSeq(ar, false, true, br, bc, d, 1, dot, ldq, vt, ldk, 0, dS, bc)
				for i := 0; i < br; i++ {
					row := P[i*bc : i*bc+bc]
					lo, hi := a.visibleKeys(i0+i, j0, j1)
					lo = min(lo, j1) - j0
					hi = max(hi-j0, lo)
					expSubSumRow(row[lo:hi], c.lse[(b*s+i0+i)*H+h])
					clear(row[:lo])
					clear(row[hi:])
					dsRow(dS[i*bc:i*bc+bc], row, D[i0+i], scale)
				}
				sgemmSeq(ar, true, false, bc, d, br, 1, P, bc, dot, ldq, 1, dvt, ldk)
				sgemmSeq(ar, false, false, br, d, bc, 1, dS, bc, kt, ldk, 1, dqt, ldq)
				sgemmSeq(ar, true, false, bc, d, br, 1, dS, bc, qt, ldq, 1, dkt, ldk)
			}
		}
	}
}
