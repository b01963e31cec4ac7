package attn

import (
	"math"
	"testing"
)

// TestSinksByHand: one sequence of one position, one head of 2 dims, q = 0
// so the only score is 0, and the sink logit 0. By hand: the softmax row
// over (score, sink) is (½, ½), so O = ½·v = (1, −2), lse = ln(e⁰ + e⁰) = ln 2;
// with dO = (1, 1), D = dO·O = −1 and ∂L/∂s = −e^(s − lse)·D = −½·(−1) = ½.
func TestSinksByHand(t *testing.T) {
	a := Shape{Batch: 1, Seq: 1, Heads: 1, KV: 1, D: 2, TileQ: 1, TileK: 1, Scale: 1 / math.Sqrt(2)}
	q, k, v := []float64{0, 0}, []float64{3, 5}, []float64{2, -4}
	o, lse := make([]float64, 2), make([]float64, 1)
	sinks := []float64{0}
	Forward(o, lse, q, k, v, a)
	SinksForward(o, lse, sinks, a)
	if o[0] != 1 || o[1] != -2 || math.Abs(lse[0]-math.Ln2) > 1e-15 {
		t.Errorf("O = %v, lse = %v; want [1 -2], ln 2", o, lse)
	}
	ds := []float64{0}
	SinksBackward(ds, sinks, []float64{1, 1}, o, lse, a)
	if math.Abs(ds[0]-0.5) > 1e-15 {
		t.Errorf("∂L/∂s = %v, want 0.5", ds[0])
	}
}
