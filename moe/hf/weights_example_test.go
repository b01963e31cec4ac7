package hf_test

import (
	"fmt"
	"path/filepath"

	"github.com/moescope/moescope/moe/hf"
)

// Load a sharded Hugging Face checkpoint (model.safetensors.index.json plus
// shards, as transformers writes it) for its config.json; the tensors come
// back in Config.Params() order, ready for Model.SetTensors.
func ExampleLoadParams() {
	dir := filepath.Join("..", "..", "testdata", "torchref", "moe")
	cfg, err := hf.Load(filepath.Join(dir, "config.json"))
	if err != nil {
		fmt.Println(err)
		return
	}
	ts, err := hf.LoadParams[float32](dir, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	ps := cfg.Params()
	fmt.Println(len(ts), "tensors")
	// Order (Params): embedding; layer 0 (dense: norm, q, k, v, o, q_norm,
	// k_norm, norm, gate/up/down = indices 1–11); layer 1 (norm, q, k, v, o,
	// q_norm, k_norm, norm = 12–19, router 20, experts from 21); final norm; LM head.
	for _, i := range []int{11, 20, 21, len(ps) - 1} {
		fmt.Println(ps[i].Name, ps[i].Shape, len(ts[i]))
	}
	// Output:
	// 35 tensors
	// model.layers.0.mlp.down_proj.weight [16 20] 320
	// model.layers.1.mlp.gate.weight [4 16] 64
	// model.layers.1.mlp.experts.0.gate_proj.weight [8 16] 128
	// lm_head.weight [24 16] 384
}
