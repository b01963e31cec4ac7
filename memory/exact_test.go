package memory

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/moe/ref"
)

// TestSavedEqualsReference is the exactness check: for many random configs
// and every policy, the saved-activation bytes memory accounts per layer
// (embedding, each block, head) equal, as integers, the bytes the
// reference implementation reports keeping while it runs forward and
// backward.
func TestSavedEqualsReference(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 11))
	for i := 0; i < 60; i++ {
		cfg := moetest.Config(r)
		m, err := ref.NewModel[float32](cfg)
		if err != nil {
			t.Fatal(err)
		}
		m.InitRandom(uint64(i))
		batch, seq := 1+r.IntN(2), 2+r.IntN(6)
		tokens := moetest.Tokens(r, cfg, batch, seq)
		units, err := Units(cfg, job.DefaultLayout())
		if err != nil {
			t.Fatal(err)
		}
		cfgJSON, _ := json.Marshal(cfg)
		for _, ac := range moetest.Policies() {
			rec := &moetest.Recorder{}
			if _, err := m.ForwardBackward(tokens, 1, ref.Options{AC: ac, Recorder: rec}); err != nil {
				t.Fatalf("config %d %s: %v", i, ac, err)
			}
			kept := moetest.SavedBytes(rec.Saved)
			if len(kept) != cfg.Layers+2 {
				t.Fatalf("config %d %s: the reference reported kept tensors in %d layers, want %d", i, ac, len(kept), cfg.Layers+2)
			}
			for _, u := range units {
				rs, err := Saved(cfg, u.Layer, Shape{Batch: batch, Seq: seq, AC: ac})
				if err != nil {
					t.Fatal(err)
				}
				if got, want := SavedBytes(rs), kept[u.Layer]; got != want {
					t.Errorf("config %d (%s) %s b%d s%d layer %d: memory accounts %d B, the reference kept %d B\n%s",
						i, cfg.ModelType, ac, batch, seq, u.Layer, got, want, cfgJSON)
				}
				delete(kept, u.Layer)
			}
			for l, n := range kept {
				t.Errorf("config %d (%s) %s: the reference kept %d B in layer %d, which memory does not know", i, cfg.ModelType, ac, n, l)
			}
		}
	}
}
