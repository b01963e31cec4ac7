package attn

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestBlocksEqualFlash: the causal attention of a sequence whose keys come
// in two blocks of scattered positions (head-tail shards {0,1,6,7} and
// {2,3,4,5} of 8), each run by BlockForward and merged by MergeBlock,
// equals the flash kernel on the whole sequence (Forward, an independent
// implementation: tiles in position order, online softmax within the
// row); BlockBackward summed over the blocks equals Backward.
func TestBlocksEqualFlash(t *testing.T) {
	checkBlocks(t, [][]int{{0, 1, 6, 7}, {2, 3, 4, 5}}, 1)
}

// FuzzBlocksEqualFlash: any dealing of the 8 positions to 1–4 key blocks
// (each position to block deal[p] mod n, empty blocks dropped) merges to
// the flash kernel's attention, in any block order.
func FuzzBlocksEqualFlash(f *testing.F) {
	f.Add(uint8(2), uint64(0x0110), uint64(1))
	f.Add(uint8(4), uint64(0x32100123), uint64(2))
	f.Fuzz(func(t *testing.T, n uint8, deal, seed uint64) {
		k := int(n%4) + 1
		blocks := make([][]int, k)
		for p := 0; p < 8; p++ {
			b := int(deal>>(4*p)&15) % k
			blocks[b] = append(blocks[b], p)
		}
		var nonEmpty [][]int
		for _, b := range blocks {
			if len(b) > 0 {
				nonEmpty = append(nonEmpty, b)
			}
		}
		checkBlocks(t, nonEmpty, seed)
	})
}

// checkBlocks runs every query of B sequences of S = 8 tokens against the
// key blocks (positions, ascending within a block) and compares with the
// flash kernel on the whole sequence.
func checkBlocks(t *testing.T, blocks [][]int, seed uint64) {
	t.Helper()
	const B, S, H, G, d = 2, 8, 4, 2, 4
	a := Shape{Batch: B, Seq: S, Heads: H, KV: G, D: d, TileQ: 4, TileK: 4, Scale: 1 / math.Sqrt(d)}
	rng := rand.New(rand.NewPCG(seed, 2))
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	q, k, v, do := fill(B*S*H*d), fill(B*S*G*d), fill(B*S*G*d), fill(B*S*H*d)
	o, lse := make([]float32, len(q)), make([]float32, B*S*H)
	Forward(o, lse, q, k, v, a)
	dq, dk, dv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
	Backward(dq, dk, dv, do, q, k, v, o, lse, a)

	all := []int{0, 1, 2, 3, 4, 5, 6, 7}
	w := G * d
	pack := func(pos []int) []float32 { // rows of k then v at pos, per sequence
		var kv []float32
		for b := 0; b < B; b++ {
			for _, p := range pos {
				kv = append(kv, k[(b*S+p)*w:][:w]...)
				kv = append(kv, v[(b*S+p)*w:][:w]...)
			}
		}
		return kv
	}
	bo, blse := make([]float32, len(o)), make([]float32, len(lse))
	for i := range blse {
		blse[i] = float32(math.Inf(-1))
	}
	o2, lse2 := make([]float32, len(o)), make([]float32, len(lse))
	var area int64
	for _, pos := range blocks {
		area += BlockForward(o2, lse2, q, pack(pos), all, pos, a)
		MergeBlock(bo, blse, o2, lse2, d)
	}
	if area != B*S*(S+1)/2 {
		t.Errorf("area %d, want B·S(S+1)/2 = %d", area, B*S*(S+1)/2)
	}
	near(t, "o", bo, o)
	near(t, "lse", blse, lse)

	bdq, bdk, bdv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
	delta := OutputDelta(do, bo, d)
	for _, pos := range blocks {
		dkv := make([]float32, B*len(pos)*2*w)
		BlockBackward(bdq, dkv, do, q, pack(pos), blse, delta, all, pos, a)
		for b := 0; b < B; b++ {
			for j, p := range pos {
				row := dkv[(b*len(pos)+j)*2*w:]
				copy(bdk[(b*S+p)*w:][:w], row[:w])
				copy(bdv[(b*S+p)*w:][:w], row[w:2*w])
			}
		}
	}
	near(t, "dq", bdq, dq)
	near(t, "dk", bdk, dk)
	near(t, "dv", bdv, dv)
}

func near(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Abs(float64(got[i]-want[i])) > 1e-5*(1+math.Abs(float64(want[i]))) {
			t.Fatalf("%s[%d] = %g, flash kernel %g", what, i, got[i], want[i])
		}
	}
}
