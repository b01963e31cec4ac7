package parallel

import (
	"fmt"
	"sync"

	"github.com/moescope/moescope/moe"
)

// FSDPShard is how one tensor is split over the N ranks of a shard group, as
// FSDP2 does: the tensor is viewed as [Outer][Rows][Inner] (row-major) and
// cut along Rows into N chunks of Chunk = ⌈Rows/N⌉ rows, the last ones
// zero-padded. Rank i of the group holds rows [i·Chunk, (i+1)·Chunk) of every
// outer slice. A dense weight [R, C] is Outer 1, Rows R, Inner C (dim-0
// sharding); stacked experts [E_local, F, D] are Outer 1, Rows E_local, Inner
// F·D on dim 0, or Outer E_local, Rows F, Inner D on dim 1.
type FSDPShard struct {
	Outer, Rows, Inner, N int
}

// Chunk is ⌈Rows/N⌉.
func (s FSDPShard) Chunk() int { return (s.Rows + s.N - 1) / s.N }

// Elements is Outer·Rows·Inner, the unsharded size.
func (s FSDPShard) Elements() int64 { return int64(s.Outer) * int64(s.Rows) * int64(s.Inner) }

// ShardElements is Outer·Chunk·Inner, one rank's share, padding included.
func (s FSDPShard) ShardElements() int64 { return int64(s.Outer) * int64(s.Chunk()) * int64(s.Inner) }

// PaddedElements is N·ShardElements: what an all-gather moves as its size S.
func (s FSDPShard) PaddedElements() int64 { return int64(s.N) * s.ShardElements() }

// Shard copies rank i's share of full into a new slice (zeros where padded).
func (s FSDPShard) Shard(full []float32, i int) []float32 {
	c := s.Chunk()
	out := make([]float32, s.ShardElements())
	for o := 0; o < s.Outer; o++ {
		for r := 0; r < c; r++ {
			row := i*c + r
			if row >= s.Rows {
				break
			}
			copy(out[(o*c+r)*s.Inner:(o*c+r+1)*s.Inner], full[(o*s.Rows+row)*s.Inner:(o*s.Rows+row+1)*s.Inner])
		}
	}
	return out
}

// Unshard writes the full tensor from the concatenation of every rank's
// share in group order ([N][Outer][Chunk][Inner]), dropping padding.
func (s FSDPShard) Unshard(gathered, full []float32) {
	c := s.Chunk()
	per := int(s.ShardElements())
	for i := 0; i < s.N; i++ {
		for o := 0; o < s.Outer; o++ {
			for r := 0; r < c; r++ {
				row := i*c + r
				if row >= s.Rows {
					break
				}
				src := i*per + (o*c+r)*s.Inner
				copy(full[(o*s.Rows+row)*s.Inner:(o*s.Rows+row+1)*s.Inner], gathered[src:src+s.Inner])
			}
		}
	}
}

// Pad lays a full tensor out as the reduce-scatter input [N][Outer][Chunk][Inner]
// (zeros in the padding), so that chunk i of the result is rank i's share.
func (s FSDPShard) Pad(full []float32) []float32 {
	out := make([]float32, 0, s.PaddedElements())
	for i := 0; i < s.N; i++ {
		out = append(out, s.Shard(full, i)...)
	}
	return out
}

// UnitTensors returns the shard geometry of every tensor of unit u on a
// group of n ranks (the shard axis size for dense units, efsdp for experts).
// Dense units hold the non-routed trainable parameters of their layer (the
// embedding for LayerEmbed; the final norm and an untied LM head for
// LayerHead); expert units hold the block's routed experts stacked per
// projection on this EP rank, [experts/ep, rows, cols], sharded on dim 0 or,
// when dim 0 would pad (efsdp·ep > experts), on dim 1. Under tensor
// parallelism each tensor is this tp rank's piece (moe.Param.TP: ⌈n/tp⌉ of
// dim 0 or dim 1; experts' width over Layout.ExpertTP), which FSDP then
// shards on its dim 0, as package memory's Units counts.
func UnitTensors(cfg *moe.Config, x *UnitIndex, m *Mesh, u Unit, n int) []FSDPShard {
	var out []FSDPShard
	tp := m.Layout.TPDegree()
	cut := func(split moe.TPSplit, rows, cols, k int) (int, int) {
		switch split {
		case moe.TPDim0:
			return (rows + k - 1) / k, cols
		case moe.TPDim1:
			return rows, (cols + k - 1) / k
		}
		return rows, cols
	}
	if u.Experts {
		el := cfg.Experts / m.Layout.EP
		dim := m.ExpertShardDim(cfg.Experts)
		xt := m.Layout.ExpertTP()
		f := (cfg.ExpertFFN + xt - 1) / xt // gate and up are cut on dim 0 (F), down on dim 1 (F)
		for _, rc := range [][2]int{{f, cfg.Hidden}, {f, cfg.Hidden}, {cfg.Hidden, f}} {
			if dim == 0 {
				out = append(out, FSDPShard{Outer: 1, Rows: el, Inner: rc[0] * rc[1], N: n})
			} else {
				out = append(out, FSDPShard{Outer: el, Rows: rc[0], Inner: rc[1], N: n})
			}
		}
		return out
	}
	for _, i := range x.ByLayer[u.Layer] {
		p := x.params[i]
		inner := 1
		for _, d := range p.Shape[1:] {
			inner *= d
		}
		rows, inner := cut(p.TP, p.Shape[0], inner, tp)
		out = append(out, FSDPShard{Outer: 1, Rows: rows, Inner: inner, N: n})
	}
	return out
}

// UnitIndex maps each dense FSDP unit's layer to its tensors' indices in
// Config.Params order: its layer's trainable parameters other than routed
// experts (the embedding for LayerEmbed; final norm and an untied LM head
// for LayerHead). It is built once per schedule or rank because Params has
// an entry per expert tensor (about 18,000 for Qwen3-30B-A3B), too many to
// rebuild for every op.
type UnitIndex struct {
	params  []moe.Param
	ByLayer map[int][]int
}

// NewUnitIndex returns cfg's index. It is shared by every caller with a
// config of the same content
// (memoized: the planner builds a schedule per candidate, and listing a
// large MoE's named tensors dominated that), so it must be read only.
func NewUnitIndex(cfg *moe.Config) *UnitIndex {
	key := fmt.Sprintf("%#v", *cfg)
	if x, ok := unitIndexes.Load(key); ok {
		return x.(*UnitIndex)
	}
	x := newUnitIndex(cfg)
	unitIndexes.Store(key, x)
	return x
}

// unitIndexes memoizes NewUnitIndex by the config's whole content (fmt
// %#v, slices included); there is one entry per model a process uses.
var unitIndexes sync.Map

func newUnitIndex(cfg *moe.Config) *UnitIndex {
	x := &UnitIndex{params: cfg.Params(), ByLayer: map[int][]int{}}
	head := cfg.LayerHead()
	for i, p := range x.params {
		if p.Buffer || p.Group == moe.GroupRouted {
			continue
		}
		layer := p.Layer
		if layer == -1 {
			layer = head
			if p.Group == moe.GroupEmbedding {
				layer = moe.LayerEmbed
			}
		}
		x.ByLayer[layer] = append(x.ByLayer[layer], i)
	}
	return x
}

// unitSizes sums a unit's tensors: unsharded, padded (S of the gather) and
// per-rank shard elements.
func unitSizes(ts []FSDPShard) (full, padded, shard int64) {
	for _, t := range ts {
		full += t.Elements()
		padded += t.PaddedElements()
		shard += t.ShardElements()
	}
	return
}
