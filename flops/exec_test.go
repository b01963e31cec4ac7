package flops_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/moe/ref"
)

// TestAccountingEqualsExecution runs forward + backward of the reference
// implementation for many random configs, every checkpointing policy and
// several attention tiles, and demands that the ops it records, summed per
// (layer, op, pass), equal flops.Ops exactly.
func TestAccountingEqualsExecution(t *testing.T) {
	r := rand.New(rand.NewPCG(2026, 11))
	for i := 0; i < 40; i++ {
		c := moetest.Config(r)
		batch, seq := 1+r.IntN(3), 1+r.IntN(9)
		tile := flops.Tile{Rows: 1 + r.IntN(4), Cols: 1 + r.IntN(4)}
		if i%4 == 0 {
			tile = flops.ExactTile
		}
		tokens := moetest.Tokens(r, c, batch, seq)
		m, err := ref.NewModel[float32](c)
		if err != nil {
			t.Fatal(err)
		}
		m.InitRandom(uint64(i))
		cfgJSON, _ := json.Marshal(c)
		for _, ac := range moetest.Policies() {
			rec := &moetest.Recorder{}
			o := ref.Options{AC: ac, Recorder: rec, TileQ: tile.Rows, TileK: tile.Cols}
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
			got, want := moetest.OpSums(rec.Ops), moetest.OpSums(recs)
			name := fmt.Sprintf("config %d (%s, b=%d s=%d, tile %s) %s", i, c.ModelType, batch, seq, tile, ac)
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s: layer %d %s %s: executed %d, flops.Ops %d\n%s", name, k.Layer, k.Op, k.Pass, got[k], v, cfgJSON)
				}
			}
			for k, v := range got {
				if _, ok := want[k]; !ok && v != 0 {
					t.Errorf("%s: layer %d %s %s: executed %d, flops.Ops has no record\n%s", name, k.Layer, k.Op, k.Pass, v, cfgJSON)
				}
			}
		}
	}
}
