package ref

import (
	"math/rand/v2"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/kernel"
)

// TestThreadsBitwise runs one MoE block forward and backward on one core
// and on two, and wants output, input gradient and weight gradients equal
// bit for bit under every checkpointing policy. It
// checks that the element-wise work split over the cores (norms, RoPE,
// residual adds, router, dispatch and combine) computes what the serial
// loops compute: the shapes are large enough that every split runs in
// parallel (kernel.ParallelFor stays serial below 32768 elements of work).
// float32 only: the split loops are the same generic code for float64,
// whose plain-loop GEMMs would take this test from seconds to tens of them.
func TestThreadsBitwise(t *testing.T) {
	threadsBitwise[float32](t)
}

func threadsBitwise[T Float](t *testing.T) {
	c := &moe.Config{Name: "threads", ModelType: "qwen3_moe", Vocab: 64, Hidden: 128, Layers: 1, Heads: 4, KVHeads: 2,
		HeadDim: 32, MoELayer: []bool{true}, Window: []int{0}, Experts: 16, TopK: 4, ExpertFFN: 64,
		Score: moe.Softmax, RoutedScale: 1, Groups: 1, TopKGroups: 1, NormTopK: true, NormTopKEps: 1e-20, QKNorm: moe.QKNormHead,
		RotaryFraction: 1, RopeTheta: 1e6, NormEps: 1e-6, InitRange: 0.1}
	const batch, seq = 2, 512
	m, err := NewModel[T](c)
	if err != nil {
		t.Fatal(err)
	}
	m.InitRandom(3)
	w, _ := m.Layer(0)
	r := rand.New(rand.NewPCG(4, 4))
	x, dy := make([]T, batch*seq*c.Hidden), make([]T, batch*seq*c.Hidden)
	for i := range x {
		x[i], dy[i] = T(r.NormFloat64()), T(r.NormFloat64())
	}
	for _, ac := range []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}} {
		run := func(threads int) [][]T {
			prev := kernel.SetThreads(threads)
			defer kernel.SetThreads(prev)
			gm, _ := NewModel[T](c)
			_, g := gm.Layer(0)
			b := NewBlock[T](c, 0, batch, seq, Options{AC: ac})
			out := b.Forward(&w, x)
			dx := b.Backward(&w, &g, dy, nil)
			return [][]T{out, dx, gm.Grad}
		}
		one, two := run(1), run(2)
		for p, name := range []string{"output", "input gradient", "weight gradients"} {
			for i := range one[p] {
				if one[p][i] != two[p][i] {
					t.Fatalf("%T %s: %s [%d] on one core %v, on two %v", T(0), ac, name, i, one[p][i], two[p][i])
				}
			}
		}
	}
}
