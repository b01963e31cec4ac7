package ref

import (
	"github.com/moescope/moescope/moe"
	"math/rand/v2"
	"testing"
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

// BenchmarkForwardBackward reports tokens/s and executed matmul GFLOP/s of
// one float32 forward + backward (selective checkpointing) of a small MoE.
func BenchmarkForwardBackward(b *testing.B) {
	c := &moe.Config{Name: "bench", ModelType: "qwen3_moe", Vocab: 4096, Hidden: 256, Layers: 2, Heads: 4, KVHeads: 2,
		HeadDim: 64, MoELayer: []bool{true, true}, Window: []int{0, 0}, Experts: 8, TopK: 2, ExpertFFN: 256,
		Score: moe.Softmax, RoutedScale: 1, Groups: 1, TopKGroups: 1, NormTopK: true, QKNorm: moe.QKNormHead,
		RotaryFraction: 1, RopeTheta: 1e6, NormEps: 1e-6, InitRange: 0.02}
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
