package ref

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moescope/moescope/moe"
)

// flopCounter sums matmul FLOPs (2·count for matmul, grouped and
// attention records, recompute included: the hardware convention).
type flopCounter struct{ flops int64 }

func (f *flopCounter) RecordOp(r moe.OpRecord) {
	if r.Op.Kind() != moe.KindElementwise {
		f.flops += 2 * r.Count
	}
}
func (f *flopCounter) RecordSaved(moe.SavedRecord) {}

// smallMoE is a Qwen3-MoE-style config of width 256 (4 heads of 64, 2 KV
// heads, 8 experts of 256, top-2) with the given vocabulary and layers,
// every layer MoE with full attention.
func smallMoE(name string, vocab, layers int) *moe.Config {
	return &moe.Config{Name: name, ModelType: "qwen3_moe", Vocab: vocab, Hidden: 256, Layers: layers, Heads: 4, KVHeads: 2,
		HeadDim: 64, MoELayer: slices.Repeat([]bool{true}, layers), Window: make([]int, layers), Experts: 8, TopK: 2, ExpertFFN: 256,
		Score: moe.Softmax, RoutedScale: 1, Groups: 1, TopKGroups: 1, NormTopK: true, QKNorm: moe.QKNormHead,
		RotaryFraction: 1, RopeTheta: 1e6, NormEps: 1e-6, InitRange: 0.02}
}

// BenchmarkForwardBackward reports tokens/s and executed matmul GFLOP/s of
// one float32 forward + backward (selective checkpointing) of a small MoE.
func BenchmarkForwardBackward(b *testing.B) {
	c := smallMoE("bench", 4096, 2)
	m, err := NewModel[float32](c)
	if err != nil {
		b.Fatal(err)
	}
	m.InitRandom(1)
	tokens := randomTokens(rand.New(rand.NewPCG(1, 1)), c, 2, 256)
	fc := &flopCounter{}
	if _, err := m.ForwardBackward(tokens, 1, Options{AC: moe.AC{Mode: moe.ACSelective}, Recorder: fc}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := m.ForwardBackward(tokens, 1, Options{AC: moe.AC{Mode: moe.ACSelective}}); err != nil {
			b.Fatal(err)
		}
	}
	s := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(2*256)/s, "tokens/s")
	b.ReportMetric(float64(fc.flops)/s/1e9, "GFLOP/s")
}
