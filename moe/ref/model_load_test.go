package ref

import (
	"math/rand/v2"
	"testing"
)

// TestLoadCounters: Model.Load counts, per MoE layer, each token's K routed
// experts, accumulating over calls until ResetLoad. By hand for the tiny
// variant (both layers MoE, K = 2): 3 sequences of 4 input tokens route
// 3·4·2 = 24 expert slots per layer per call.
func TestLoadCounters(t *testing.T) {
	c := tinyVariants()["qwen3_moe"]
	m := newTestModel(t, c, 3)
	tokens := randomTokens(rand.New(rand.NewPCG(1, 2)), c, 3, 4)
	sums := func() []int64 {
		s := make([]int64, c.Layers)
		for l, load := range m.Load {
			for _, n := range load {
				s[l] += n
			}
		}
		return s
	}
	for call, want := range []int64{24, 48} {
		if _, err := m.ForwardBackward(tokens, 1, Options{}); err != nil {
			t.Fatal(err)
		}
		for l, got := range sums() {
			if got != want {
				t.Errorf("after call %d: layer %d load sum %d, want %d", call+1, l, got, want)
			}
		}
	}
	m.ResetLoad()
	for l, got := range sums() {
		if got != 0 {
			t.Errorf("after ResetLoad: layer %d load sum %d", l, got)
		}
	}
}

// TestTensorByName: Tensor returns the parameter's own storage (writes show
// in Tensors), and nil for a name the model does not have.
func TestTensorByName(t *testing.T) {
	c := tinyVariants()["qwen3_moe"]
	m := newTestModel(t, c, 3)
	for i, p := range m.Params {
		v := m.Tensor(p.Name)
		if int64(len(v)) != p.Elements() {
			t.Fatalf("%s: %d elements, shape %v", p.Name, len(v), p.Shape)
		}
		v[0] = float64(1000 + i)
		if m.Tensors()[i][0] != float64(1000+i) {
			t.Errorf("%s: Tensor is not the model's storage", p.Name)
		}
	}
	if m.Tensor("model.layers.9.mlp.gate.weight") != nil {
		t.Error("unknown name returned a tensor")
	}
}
