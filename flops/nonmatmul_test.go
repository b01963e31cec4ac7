package flops

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
)

// TestNonMatmulFLOPsTiny works the built-in tiny model by hand: D 32, two
// layers (0 dense with Fd 48, 1 MoE with E 4, K 2, F 16), q = 4·8 = 32,
// kv = 2·8 = 16, rotary 8, V 64, per-head QK-norm, softmax router; two
// sequences of 8 tokens, T = 16. Element counts follow moe/ops.go, per
// element costs the ElementCost table (forward + backward_data +
// backward_weight).
func TestNonMatmulFLOPsTiny(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	const T, D, L = 16, 32, 2
	want := map[moe.Op]int64{
		moe.OpEmbed:      T * D * (0 + 1),
		moe.OpAttnNorm:   L * T * D * (4 + 6 + 3),
		moe.OpFFNNorm:    L * T * D * (4 + 6 + 3),
		moe.OpFinalNorm:  T * D * (4 + 6 + 3),
		moe.OpQNorm:      L * T * 32 * (4 + 6 + 3),
		moe.OpKNorm:      L * T * 16 * (4 + 6 + 3),
		moe.OpRoPE:       L * T * (4 + 2) * 8 * (3 + 3),
		moe.OpResidual:   L * 2 * T * D * 1,
		moe.OpRouterTopK: T * 4 * (5 + 4),
		moe.OpDispatch:   0,
		moe.OpExpertAct:  T * 2 * 16 * (5 + 11),
		moe.OpCombine:    T * 2 * D * (2 + 3),
		moe.OpDenseAct:   T * 48 * (5 + 11),
		moe.OpLoss:       T * 64 * (5 + 2),
	}
	recs, err := Ops(cfg, Shape{Seq: 8, Batch: 2}, moe.AC{Mode: moe.ACNone}, ExactTile)
	if err != nil {
		t.Fatal(err)
	}
	got, err := NonMatmulFLOPs(cfg, recs)
	if err != nil {
		t.Fatal(err)
	}
	for op, w := range want {
		if got[op] != w {
			t.Errorf("none: %s = %d FLOPs, hand count %d", op, got[op], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("ops counted %v, want exactly %d ops", got, len(want))
	}

	// Selective checkpointing recomputes every elementwise op of a block at
	// its forward cost: attn_norm gains L·T·D·4.
	recs, err = Ops(cfg, Shape{Seq: 8, Batch: 2}, moe.AC{Mode: moe.ACSelective}, ExactTile)
	if err != nil {
		t.Fatal(err)
	}
	sel, err := NonMatmulFLOPs(cfg, recs)
	if err != nil {
		t.Fatal(err)
	}
	if w := want[moe.OpAttnNorm] + L*T*D*4; sel[moe.OpAttnNorm] != w {
		t.Errorf("selective: attn_norm = %d, want %d", sel[moe.OpAttnNorm], w)
	}
}

func TestElementCostSigmoidRouter(t *testing.T) {
	cfg := &moe.Config{Score: moe.Sigmoid}
	// σ = exp, +1, ÷ forward; g·σ·(1−σ) backward.
	if f, b := ElementCost(cfg, moe.OpRouterTopK, moe.Forward), ElementCost(cfg, moe.OpRouterTopK, moe.BackwardData); f != 3 || b != 3 {
		t.Errorf("sigmoid router: forward %d, backward %d; want 3, 3", f, b)
	}
	if r := ElementCost(cfg, moe.OpExpertAct, moe.Recompute); r != 5 {
		t.Errorf("recompute of expert_act costs %d, want its forward 5", r)
	}
}
