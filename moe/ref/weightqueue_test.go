package ref_test

import (
	"slices"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/moe/ref"
)

// TestWeightQueue: a backward whose weight-gradient GEMMs are deferred
// returns the same input gradient, leaves those GEMMs' weight gradients
// untouched until the queue runs, and after Run holds every gradient of
// the plain backward bit for bit (each dW is the same GEMM accumulated
// into the same zeroed tensor, only later), for a MoE block, a dense
// block and the head, with the inputs the queue copied overwritten in
// between.
func TestWeightQueue(t *testing.T) {
	c := moetest.TinyMoELayers(true, false)
	c.AuxLossCoef, c.OutputRouterLogits = 0, false
	run := func(deferred bool) (dx []float32, before, after [][]float32) {
		m, err := ref.NewModel[float32](c)
		if err != nil {
			t.Fatal(err)
		}
		m.InitRandom(3)
		layers, global, err := ref.Views(c, m.Tensors())
		if err != nil {
			t.Fatal(err)
		}
		gl, gg, _ := ref.Views(c, m.Grads())
		o := ref.Options{AC: moe.AC{Mode: moe.ACSelective}}
		ids, labels := []int{1, 5, 2, 9, 3, 7, 4, 0}, []int{5, 2, 9, 3, 7, 4, 0, 6}
		emb := ref.NewEmbedding[float32](c, o)
		x := emb.Forward(global.Embed, ids)
		blocks := make([]*ref.Block[float32], c.Layers)
		for l := range blocks {
			blocks[l] = ref.NewBlock[float32](c, l, 2, 4, o)
			x = blocks[l].Forward(&layers[l], x)
		}
		head := ref.NewHead[float32](c, o)
		head.Forward(&global, x, labels)
		q := &ref.WeightQueue{}
		if deferred {
			head.DeferWeightGrads(q)
			for _, b := range blocks {
				b.DeferWeightGrads(q)
			}
		}
		dx = head.Backward(&global, &gg, 1)
		for l := c.Layers - 1; l >= 0; l-- {
			g := slices.Clone(dx)
			dx = blocks[l].Backward(&layers[l], &gl[l], g, nil)
			clear(g) // the queue must have copied what it reads
		}
		for _, g := range m.Grads() {
			before = append(before, slices.Clone(g))
		}
		if deferred && q.Len() == 0 {
			t.Fatal("nothing was queued")
		}
		q.Run()
		for _, g := range m.Grads() {
			after = append(after, slices.Clone(g))
		}
		return dx, before, after
	}
	dx0, _, want := run(false)
	dx1, before, got := run(true)
	if !slices.Equal(dx0, dx1) {
		t.Error("deferred backward returned another input gradient")
	}
	ps := c.Params()
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("%s: gradient after Run differs from the plain backward's", ps[i].Name)
		}
		// GEMM weights (2-D and 3-D) wait for Run; norm scales do not (the
		// embedding's backward is not run here).
		if ps[i].Group == moe.GroupEmbedding || ps[i].Buffer {
			continue
		}
		zero := !slices.ContainsFunc(before[i], func(v float32) bool { return v != 0 })
		if gemm := len(ps[i].Shape) >= 2; gemm != zero {
			t.Errorf("%s (shape %v): before Run all zero = %v", ps[i].Name, ps[i].Shape, zero)
		}
	}
}

// TestWeightQueueDo: Do on a nil queue runs f at once; on a queue it runs
// nothing until Run, which runs the queued functions in the order queued
// and empties the queue (a second Run runs nothing).
func TestWeightQueueDo(t *testing.T) {
	var order []int
	var none *ref.WeightQueue
	none.Do(func() { order = append(order, 0) })
	if !slices.Equal(order, []int{0}) {
		t.Fatalf("nil queue: ran %v, want [0] at once", order)
	}
	q := &ref.WeightQueue{}
	for i := 1; i <= 3; i++ {
		q.Do(func() { order = append(order, i) })
	}
	if q.Len() != 3 || len(order) != 1 {
		t.Fatalf("queue: Len %d, ran %v before Run; want 3 queued, nothing more run", q.Len(), order)
	}
	q.Run()
	q.Run()
	if want := []int{0, 1, 2, 3}; !slices.Equal(order, want) || q.Len() != 0 {
		t.Errorf("after Run: ran %v, Len %d; want %v, 0", order, q.Len(), want)
	}
}

// queueStage is an ExpertStage that only keeps the weight queue a block
// hands it (its experts are never run here).
type queueStage struct{ q *ref.WeightQueue }

func (s *queueStage) ExpertsForward(_ int, x []float32, _ []int, _ moe.Pass, _ bool) []float32 {
	return x
}
func (s *queueStage) ExpertsBackward(_ int, dy []float32) []float32 { return dy }
func (s *queueStage) DeferWeightGrads(q *ref.WeightQueue)           { s.q = q }

// TestBlockHandsQueueToStage: a block's DeferWeightGrads hands the queue
// to an ExpertStage that takes one, and nil again after, so that a stage
// replacing the local experts defers with the block.
func TestBlockHandsQueueToStage(t *testing.T) {
	c := moetest.TinyMoELayers(true, false)
	st := &queueStage{}
	b := ref.NewBlock[float32](c, 0, 2, 4, ref.Options{})
	b.Experts = st
	q := &ref.WeightQueue{}
	b.DeferWeightGrads(q)
	if st.q != q {
		t.Fatalf("stage holds queue %p, want the block's %p", st.q, q)
	}
	b.DeferWeightGrads(nil)
	if st.q != nil {
		t.Errorf("stage still holds queue %p after DeferWeightGrads(nil)", st.q)
	}
}
