package memory

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/moescope/moescope/moe"
)

// savedRecorder sums, per layer, the bytes of the tensors the reference
// implementation reports keeping for backward.
type savedRecorder struct{ bytes map[int]int64 }

func (r *savedRecorder) RecordOp(moe.OpRecord) {}
func (r *savedRecorder) RecordSaved(s moe.SavedRecord) {
	r.bytes[s.Layer] += s.Bytes()
}

// randomModel draws a small valid config covering the supported variants:
// dense and MoE layers, QK-norm (none, per head, full), QKV bias, shared
// experts (gated or not), softmax or sigmoid routing with selection bias,
// renormalized top-k, grouped top-k, sliding windows, tied embeddings.
func randomModel(r *rand.Rand, i int) *moe.Config {
	pick := func(xs ...int) int { return xs[r.IntN(len(xs))] }
	H := pick(2, 4)
	c := &moe.Config{Name: fmt.Sprintf("random-%d", i), ModelType: "qwen3_moe",
		Vocab: pick(17, 32, 40), Hidden: pick(8, 12, 16), Layers: pick(1, 2, 3), Heads: H, KVHeads: H / pick(1, 2),
		HeadDim: pick(4, 8), DenseFFN: pick(8, 20), Experts: pick(4, 6, 8), ExpertFFN: pick(4, 6, 10),
		Score: moe.Softmax, RoutedScale: 1, Groups: 1, TopKGroups: 1, NormTopK: r.IntN(2) == 0,
		QKNorm: []moe.QKNorm{moe.QKNormNone, moe.QKNormHead, moe.QKNormFull}[r.IntN(3)], QKVBias: r.IntN(2) == 0,
		RotaryFraction: 1, RopeTheta: 10000, NormEps: 1e-6, InitRange: 0.02, TiedEmbeddings: r.IntN(3) == 0}
	c.TopK = 1 + r.IntN(min(c.Experts, 3))
	for l := 0; l < c.Layers; l++ {
		c.MoELayer = append(c.MoELayer, r.IntN(4) != 0)
		c.Window = append(c.Window, pick(0, 0, 3))
	}
	if r.IntN(3) == 0 {
		c.SharedExperts, c.SharedFFN, c.SharedGated = pick(1, 2), pick(4, 6), r.IntN(2) == 0
	}
	if r.IntN(3) == 0 {
		c.Score, c.SelectionBias = moe.Sigmoid, true
		if c.Experts%2 == 0 && c.TopK <= c.Experts/2 {
			c.Groups, c.TopKGroups = 2, 1
		}
	}
	return c
}

// TestSavedEqualsReference is the exactness check: for many random configs
// and every policy, the saved-activation bytes memory accounts per layer
// (embedding, each block, head) equal, as integers, the bytes the
// reference implementation reports keeping while it runs forward and
// backward.
func TestSavedEqualsReference(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 11))
	policies := []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull},
		{Mode: moe.ACLayer, Every: 1}, {Mode: moe.ACLayer, Every: 2}, {Mode: moe.ACLayer, Every: 3}}
	for i := 0; i < 40; i++ {
		cfg := randomModel(r, i)
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%s: %v", cfg.Name, err)
		}
		m, err := moe.NewModel[float32](cfg)
		if err != nil {
			t.Fatal(err)
		}
		m.InitRandom(uint64(i))
		batch, seq := 1+r.IntN(2), 2+r.IntN(6)
		tokens := make([][]int, batch)
		for b := range tokens {
			for j := 0; j <= seq; j++ {
				tokens[b] = append(tokens[b], r.IntN(cfg.Vocab))
			}
		}
		for _, ac := range policies {
			rec := &savedRecorder{bytes: map[int]int64{}}
			if _, err := m.ForwardBackward(tokens, 1, moe.Options{AC: ac, Recorder: rec}); err != nil {
				t.Fatalf("%s %s: %v", cfg.Name, ac, err)
			}
			if len(rec.bytes) != cfg.Layers+2 {
				t.Fatalf("%s %s: the reference reported kept tensors in %d layers, want %d", cfg.Name, ac, len(rec.bytes), cfg.Layers+2)
			}
			units, err := Units(cfg, moe.DefaultLayout())
			if err != nil {
				t.Fatal(err)
			}
			for _, u := range units {
				rs, err := Saved(cfg, u.Layer, Shape{Batch: batch, Seq: seq, AC: ac})
				if err != nil {
					t.Fatal(err)
				}
				if got, want := SavedBytes(rs), rec.bytes[u.Layer]; got != want {
					t.Errorf("%s %s b%d s%d layer %d: memory accounts %d B, the reference kept %d B",
						cfg.Name, ac, batch, seq, u.Layer, got, want)
				}
				delete(rec.bytes, u.Layer)
			}
			for l, n := range rec.bytes {
				t.Errorf("%s %s: the reference kept %d B in layer %d, which memory does not know", cfg.Name, ac, n, l)
			}
		}
	}
}
