package memory

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// tpDense is a one-block dense model small enough to size by hand: D 8,
// H 4, G 2, d 2 (q = 8, kv = 4), F_d 16, V 10, untied, no QK norm.
func tpDense() *moe.Config {
	return &moe.Config{
		Name: "tp-dense", ModelType: "llama", Vocab: 10, Hidden: 8, Layers: 1, Heads: 4, KVHeads: 2, HeadDim: 2,
		DenseFFN: 16, MoELayer: []bool{false}, Window: []int{0}, QKNorm: moe.QKNormNone, RotaryFraction: 1, RopeTheta: 10000, NormEps: 1e-6, InitRange: 0.1,
	}
}

// TestUnitsTP: per-rank elements at tp 2 derived by hand from torchtitan's
// plan (column-wise q, k, v, gate, up, LM head and the embedding's
// vocabulary rows; row-wise o and down; norms replicated).
func TestUnitsTP(t *testing.T) {
	cfg := tpDense()
	l := job.Layout{GPUs: 2, TP: 2}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	us, err := Units(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	// embed [10, 8] → [⌈10/2⌉ = 5, 8] = 40.
	// block: norms 8 + 8; q [8, 8] → [4, 8] = 32; k, v [4, 8] → [2, 8] = 16
	// each; o [8, 8] → [8, 4] = 32; gate, up [16, 8] → [8, 8] = 64 each;
	// down [8, 16] → [8, 8] = 64: 304.
	// head: norm 8 + lm_head [5, 8] = 40: 48.
	want := []int64{40, 304, 48}
	if len(us) != len(want) {
		t.Fatalf("%d units, want %d", len(us), len(want))
	}
	for i, u := range us {
		if u.Local != want[i] || u.Shard != want[i] {
			t.Errorf("unit %d (layer %d): local %d, shard %d; want %d (dp_shard 1)", i, u.Layer, u.Local, u.Shard, want[i])
		}
	}
}

// TestSavedTP: a tp rank's saved activations of a dense block, derived by
// hand for T = 1 × 4 tokens at tp 2 (bf16 activations, f32 rstd and lse).
func TestSavedTP(t *testing.T) {
	cfg := tpDense()
	for _, c := range []struct {
		ac   moe.AC
		want int64
	}{
		// none: sequence-parallel attn_norm input T·D/2 = 16 and rstd
		// 2 (f32); q_proj input, the all-gathered T·D = 32 (whole);
		// attention q T·8/2 = 16, k, v T·4/2 = 8 each, output 16, lse
		// T·4/2 = 8 (f32); ffn_norm input 16, rstd 2 (f32); gate input
		// 32 (whole); act gate, silu, up T·16/2 = 32 each; down input 32.
		// bf16: 16+32+16+8+8+16+16+32+96+32 = 272 → 544 B; f32: 2+8+2 =
		// 12 → 48 B.
		{moe.AC{Mode: moe.ACNone}, 544 + 48},
		// selective: input 16; outputs of q (16), v (8), gate (32) and the
		// row-parallel down's partial sum before its reduce-scatter
		// (T·D = 32, whole); attention output 16; the two reduce-scatter
		// outputs T/2·D = 16 each: 152 bf16 → 304 B; lse 8 f32 → 32 B.
		{moe.AC{Mode: moe.ACSelective}, 304 + 32},
		// full: the block input only, T/2·D = 16 bf16.
		{moe.AC{Mode: moe.ACFull}, 32},
	} {
		rs, err := Saved(cfg, 0, Shape{Batch: 1, Seq: 4, AC: c.ac, TP: 2})
		if err != nil {
			t.Fatal(err)
		}
		if got := SavedBytes(rs); got != c.want {
			t.Errorf("%s: %d B saved, want %d: %v", c.ac, got, c.want, rs)
		}
	}
	// The head: final_norm input 16 bf16 + rstd 2 f32, lm_head input 32
	// bf16 (whole), loss parallel's log-probs T·⌈10/2⌉ = 20 f32, labels 4
	// i64: 32 + 8 + 64 + 80 + 32 = 216 B.
	rs, err := Saved(cfg, cfg.LayerHead(), Shape{Batch: 1, Seq: 4, AC: moe.AC{Mode: moe.ACNone}, TP: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got := SavedBytes(rs); got != 216 {
		t.Errorf("head: %d B saved, want 216: %v", got, rs)
	}
}

// TestEstimateTPSeq: the memory estimate refuses a sequence length tp
// cannot split as torchtitan does.
func TestEstimateTPSeq(t *testing.T) {
	l := job.Layout{GPUs: 2, TP: 2}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	if _, err := Estimate(tpDense(), l, Batch{LBS: 1, Seq: 6}, Options{}); err == nil {
		t.Error("seq 6 at tp 2 accepted; torchtitan needs seq divisible by 2·tp = 4")
	}
	if _, err := Estimate(tpDense(), l, Batch{LBS: 1, Seq: 8}, Options{}); err != nil {
		t.Error(err)
	}
}

// TestSavedTPExperts: the routed experts' saved tensors on a tp rank,
// derived by hand for one MoE block (D 8, E 4, K 2, F 6) at tp 2, T = 1 × 4
// tokens, policy none, bf16 activations: the (token, expert) rows are T·K =
// 8. With ep = 1 (experts split over tp, as etp = tp) every tp rank holds
// all 8 rows at width F/2 = 3: expert_gate input 8·8 = 64, act gate, silu,
// up and down input 8·3 = 24 each, combine expert_output 64 (bf16) and
// weights 8 (f32), dispatch order 8 (i64). With ep 2 and etp 1 EP borrows
// the tp ranks and each routes 8/2 = 4 rows at the whole width 6: input
// 4·8 = 32, act and down input 4·6 = 24 each, expert_output 32, weights 4,
// order 4. The router's scores (T·E = 16 f32) and indices (T·K = 8 i64)
// are whole in both (the router is replicated).
func TestSavedTPExperts(t *testing.T) {
	cfg := &moe.Config{
		Name: "tp-moe", ModelType: "qwen3_moe", Vocab: 10, Hidden: 8, Layers: 1, Heads: 2, KVHeads: 2, HeadDim: 4,
		MoELayer: []bool{true}, Window: []int{0}, Experts: 4, TopK: 2, ExpertFFN: 6, Score: moe.Softmax, RoutedScale: 1,
		Groups: 1, TopKGroups: 1, QKNorm: moe.QKNormNone, RotaryFraction: 1, RopeTheta: 10000, NormEps: 1e-6, InitRange: 0.1,
	}
	for _, c := range []struct {
		name  string
		expTP int
		rows  int
		want  map[string]int64 // elements by op/tensor
	}{
		{"ep 1", 2, 1, map[string]int64{"expert_gate/input": 64, "expert_act/gate": 24, "expert_act/silu_gate": 24, "expert_act/up": 24,
			"expert_down/input": 24, "combine/expert_output": 64, "combine/weights": 8, "dispatch/order": 8,
			"router_topk/scores": 16, "router_topk/indices": 8}},
		{"ep 2, etp 1", 1, 2, map[string]int64{"expert_gate/input": 32, "expert_act/gate": 24, "expert_act/silu_gate": 24, "expert_act/up": 24,
			"expert_down/input": 24, "combine/expert_output": 32, "combine/weights": 4, "dispatch/order": 4,
			"router_topk/scores": 16, "router_topk/indices": 8}},
	} {
		rs, err := Saved(cfg, 0, Shape{Batch: 1, Seq: 4, AC: moe.AC{Mode: moe.ACNone}, TP: 2, ExpertTP: c.expTP, ExpertRows: c.rows})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, r := range rs {
			got[string(r.Op)+"/"+string(r.Tensor)] = r.Elements
		}
		for k, v := range c.want {
			if got[k] != v {
				t.Errorf("%s: %s = %d elements, want %d", c.name, k, got[k], v)
			}
		}
	}
}
