package ref_test

import (
	"fmt"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/ref"
)

// ExampleBlock drives the model stage by stage, as a parallel rank does
// with weights it gathered: embedding, every block, head, then backward
// in reverse. The loss equals Model.Evaluate's.
func ExampleBlock() {
	c := &moe.Config{Name: "tiny", ModelType: "qwen3_moe", Vocab: 11, Hidden: 8, Layers: 2, Heads: 2, KVHeads: 1,
		HeadDim: 4, MoELayer: []bool{true, true}, Window: []int{0, 0}, Experts: 4, TopK: 2, ExpertFFN: 6,
		Score: moe.Softmax, RoutedScale: 1, Groups: 1, TopKGroups: 1, NormTopK: true, QKNorm: moe.QKNormHead,
		RotaryFraction: 1, RopeTheta: 1e4, NormEps: 1e-6, InitRange: 0.2}
	m, err := ref.NewModel[float64](c)
	if err != nil {
		panic(err)
	}
	m.InitRandom(7)
	tokens := [][]int{{1, 5, 2, 9, 3}}
	ids, labels := tokens[0][:4], tokens[0][1:]

	layers, global, err := ref.Views(c, m.Tensors())
	if err != nil {
		panic(err)
	}
	gl, gg, _ := ref.Views(c, m.Grads())
	o := ref.Options{AC: moe.AC{Mode: moe.ACSelective}}
	emb := ref.NewEmbedding[float64](c, o)
	x := emb.Forward(global.Embed, ids)
	blocks := make([]*ref.Block[float64], c.Layers)
	for l := range blocks {
		blocks[l] = ref.NewBlock[float64](c, l, 1, 4, o)
		x = blocks[l].Forward(&layers[l], x)
	}
	head := ref.NewHead[float64](c, o)
	loss := head.Forward(&global, x, labels)
	dx := head.Backward(&global, &gg, 1)
	for l := c.Layers - 1; l >= 0; l-- {
		dx = blocks[l].Backward(&layers[l], &gl[l], dx, nil)
	}
	emb.Backward(gg.Embed, dx)

	whole, _ := m.Evaluate(tokens, ref.Options{})
	fmt.Println(loss == whole.Loss, blocks[0].ExpertCounts() != nil)
	// Output: true true
}
