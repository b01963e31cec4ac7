package job

import (
	"testing"

	"github.com/moescope/moescope/moe/hf"
)

// TestDelayedGEMMs counts by hand Megatron-Core's TE GEMMs with
// delayed-scaling state: qwen3-30b-a3b (48 MoE blocks, 128 routed experts,
// no shared experts, GQA) at ep 8 keeps per block linear_qkv and
// linear_proj (2) and 16 local experts' fc1 and fc2 (32): 34 × 48 = 1632;
// linear only, 96; the head's index and the embedding's count nothing;
// another recipe, none. deepseek-v3 (MLA with a query latent: 5
// attention linears; 3 dense blocks with fc1 and fc2; 58 MoE blocks with
// one shared expert's fc1 and fc2) at ep 64, 4 local experts: dense
// blocks 7, MoE blocks 5 + 2 + 8 = 15: 3·7 + 58·15 = 891.
func TestDelayedGEMMs(t *testing.T) {
	r := DefaultRecipe()
	r.Precision = FP8Delayed
	if err := r.Resolve(); err != nil {
		t.Fatal(err)
	}
	layers := func(n int) []int {
		out := []int{-1, n} // the embedding and the head
		for i := range n {
			out = append(out, i)
		}
		return out
	}
	for _, c := range []struct {
		model string
		ep    int
		sets  Quantize
		want  int64
	}{
		{"qwen3-30b-a3b", 8, nil, 1632},
		{"qwen3-30b-a3b", 8, Quantize{QuantLinear}, 96},
		{"deepseek-v3", 64, nil, 891},
	} {
		cfg, err := hf.Load(c.model)
		if err != nil {
			t.Fatal(err)
		}
		r.Quantize = c.sets
		if got := r.DelayedGEMMs(cfg, Layout{EP: c.ep}, layers(cfg.Layers)); got != c.want {
			t.Errorf("%s ep %d %v: %d GEMMs, want %d by hand", c.model, c.ep, c.sets, got, c.want)
		}
	}
	r.Precision, r.Quantize = FP8Current, nil
	cfg, _ := hf.Load("qwen3-30b-a3b")
	if got := r.DelayedGEMMs(cfg, Layout{EP: 8}, layers(cfg.Layers)); got != 0 {
		t.Errorf("fp8-current: %d GEMMs with amax histories, want 0", got)
	}
}
