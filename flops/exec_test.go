package flops_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe"
)

// execConfig draws a small valid config mixing every option the reference
// implementation executes.
func execConfig(r *rand.Rand) *moe.Config {
	c := &moe.Config{Name: "rand", ModelType: "qwen3_moe", RoutedScale: 1, Groups: 1, TopKGroups: 1,
		RopeTheta: 10000, NormEps: 1e-6, InitRange: 0.3, RotaryFraction: 1}
	c.Vocab = 5 + r.IntN(12)
	c.Hidden = 4 + r.IntN(6)
	c.Layers = 1 + r.IntN(3)
	c.KVHeads = 1 + r.IntN(2)
	c.Heads = c.KVHeads * (1 + r.IntN(3))
	c.HeadDim = 2 * (1 + r.IntN(3))
	c.DenseFFN = 2 + r.IntN(5)
	c.MoELayer, c.Window = make([]bool, c.Layers), make([]int, c.Layers)
	for l := range c.MoELayer {
		c.MoELayer[l] = r.IntN(4) != 0
		if r.IntN(3) == 0 {
			c.Window[l] = 1 + r.IntN(6)
		}
	}
	if c.MoELayers() > 0 {
		c.Experts = 2 + r.IntN(6)
		c.TopK = 1 + r.IntN(c.Experts)
		c.ExpertFFN = 2 + r.IntN(4)
		c.Score = moe.Softmax
		c.NormTopK = r.IntN(2) == 0
		c.AuxLossCoef = 0.01
		c.OutputRouterLogits = r.IntN(2) == 0
		if r.IntN(3) == 0 {
			c.Score, c.SelectionBias, c.OutputRouterLogits = moe.Sigmoid, r.IntN(2) == 0, false
			c.RoutedScale = 2.5
			if c.Experts%2 == 0 && r.IntN(2) == 0 {
				c.Groups, c.TopKGroups = 2, 1+r.IntN(2)
				c.TopK = 1 + r.IntN(c.TopKGroups*c.Experts/2)
			}
		}
		if r.IntN(2) == 0 {
			c.SharedExperts, c.SharedFFN = 1+r.IntN(2), 2+r.IntN(3)
			c.SharedGated = r.IntN(2) == 0
		}
	}
	c.QKNorm = []moe.QKNorm{moe.QKNormNone, moe.QKNormHead, moe.QKNormFull}[r.IntN(3)]
	c.QKVBias = r.IntN(2) == 0
	if c.HeadDim >= 4 && r.IntN(2) == 0 {
		c.RotaryFraction = 0.5
	}
	c.TiedEmbeddings = r.IntN(2) == 0
	return c
}

type opKey struct {
	layer int
	op    moe.Op
	pass  moe.Pass
}

type opSum map[opKey]int64

func (s opSum) RecordOp(r moe.OpRecord)     { s[opKey{r.Layer, r.Op, r.Pass}] += r.Count }
func (s opSum) RecordSaved(moe.SavedRecord) {}

// TestAccountingEqualsExecution runs forward + backward of the reference
// implementation for many random configs, every checkpointing policy and
// several attention tiles, and demands that the ops it records, summed per
// (layer, op, pass), equal flops.Ops exactly.
func TestAccountingEqualsExecution(t *testing.T) {
	r := rand.New(rand.NewPCG(2026, 11))
	policies := []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull},
		{Mode: moe.ACLayer, Every: 1}, {Mode: moe.ACLayer, Every: 2}, {Mode: moe.ACLayer, Every: 3}}
	for i := 0; i < 40; i++ {
		c := execConfig(r)
		if err := c.Validate(); err != nil {
			t.Fatalf("config %d: %v", i, err)
		}
		batch, seq := 1+r.IntN(3), 1+r.IntN(9)
		tile := flops.Tile{Rows: 1 + r.IntN(4), Cols: 1 + r.IntN(4)}
		if i%4 == 0 {
			tile = flops.ExactTile
		}
		tokens := make([][]int, batch)
		for b := range tokens {
			tokens[b] = make([]int, seq+1)
			for j := range tokens[b] {
				tokens[b][j] = r.IntN(c.Vocab)
			}
		}
		m, err := moe.NewModel[float32](c)
		if err != nil {
			t.Fatal(err)
		}
		m.InitRandom(uint64(i))
		for _, ac := range policies {
			got := opSum{}
			o := moe.Options{AC: ac, Recorder: got, TileQ: tile.Rows, TileK: tile.Cols}
			if c.OutputRouterLogits {
				o.AuxCoef = c.AuxLossCoef
			}
			if _, err := m.ForwardBackward(tokens, 1, o); err != nil {
				t.Fatal(err)
			}
			recs, err := flops.Ops(c, flops.Shape{Seq: seq, Batch: batch}, ac, tile)
			if err != nil {
				t.Fatal(err)
			}
			want := opSum{}
			for _, x := range recs {
				want.RecordOp(x)
			}
			name := fmt.Sprintf("config %d (%s, b=%d s=%d, tile %s) %s", i, c.ModelType, batch, seq, tile, ac)
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s: layer %d %s %s: executed %d, flops.Ops %d", name, k.layer, k.op, k.pass, got[k], v)
				}
			}
			for k, v := range got {
				if _, ok := want[k]; !ok && v != 0 {
					t.Errorf("%s: layer %d %s %s: executed %d, flops.Ops has no record", name, k.layer, k.op, k.pass, v)
				}
			}
		}
	}
}
