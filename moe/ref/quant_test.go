package ref

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/quant"
)

// quantConfig is a small MoE whose GEMM dimensions are multiples of 16
// (the recipes convert only those), with three blocks so that NVFP4's last
// BF16 block leaves two converted.
func quantConfig() *moe.Config {
	return &moe.Config{Name: "quant", ModelType: "qwen3_moe", Vocab: 64, Hidden: 64, Layers: 3, Heads: 4, KVHeads: 2,
		HeadDim: 16, MoELayer: []bool{true, true, true}, Window: []int{0, 0, 0}, Experts: 4, TopK: 2, ExpertFFN: 32,
		Score: moe.Softmax, RoutedScale: 1, Groups: 1, TopKGroups: 1, NormTopK: true, QKNorm: moe.QKNormHead,
		RotaryFraction: 1, RopeTheta: 1e4, NormEps: 1e-6, InitRange: 0.02}
}

// TestQuantizedLinearOperands checks the plumbing of one converted linear:
// its output must be the float32 product of the operands quant.Apply gives
// independently (x along its rows, W along its rows), and an unconverted
// op (the router) must see its operands unchanged.
func TestQuantizedLinearOperands(t *testing.T) {
	r, _ := quant.Lookup("mxfp8")
	q := quant.NewGEMMs(r, true, true, false, 4, 1)
	ex := &exec{q: q, tileQ: 128, tileK: 128}
	const m, n, k = 3, 16, 64
	rng := rand.New(rand.NewPCG(2, 3))
	x, w := randVec(rng, m*k), randVec(rng, n*k)
	y := make([]float32, m*n)
	linear(ex, 0, moe.OpQProj, moe.Forward, y, x, w, nil, m, n, k)
	qx, qw := make([]float32, m*k), make([]float32, n*k)
	r.Forward[0].Apply(qx, x, m, k, quant.AlongCols, nil)
	r.Forward[1].Apply(qw, w, n, k, quant.AlongCols, nil)
	changed := false
	for i := range m {
		for j := range n {
			var s float64
			for p := range k {
				s += float64(qx[i*k+p]) * float64(qw[j*k+p])
			}
			if math.Abs(s-float64(y[i*n+j])) > 1e-4*(1+math.Abs(s)) {
				t.Fatalf("y[%d,%d] = %v, want Q(x)·Q(W)ᵀ = %v", i, j, y[i*n+j], s)
			}
		}
	}
	for i := range qx {
		changed = changed || qx[i] != x[i]
	}
	if !changed {
		t.Error("MXFP8 left every input value unchanged: nothing was quantised")
	}
	a, b := quantPair(q, moe.OpRouter, 0, gemmForward, x, w, m, n, k)
	if &a[0] != &x[0] || &b[0] != &w[0] {
		t.Error("the router's GEMM was quantised; it stays high precision")
	}
	// NVFP4 keeps the last of 4 blocks (index 3) in high precision only.
	nv, _ := quant.Lookup("nvfp4")
	q = quant.NewGEMMs(nv, true, true, false, 4, 1)
	if a, _ := quantPair(q, moe.OpQProj, 3, gemmForward, x, w, m, n, k); &a[0] != &x[0] {
		t.Error("NVFP4 quantised the last block's GEMM; it stays BF16")
	}
	if a, _ := quantPair(q, moe.OpQProj, 2, gemmForward, x, w, m, n, k); &a[0] == &x[0] {
		t.Error("NVFP4 left block 2 of 4 unquantised")
	}
}

// TestRecipeDeviations runs the quant model in BF16 and under MXFP8 and
// NVFP4: both move the gradients, MXFP8 by a few percent, NVFP4 (4-bit
// elements) further, and the losses stay close.
func TestRecipeDeviations(t *testing.T) {
	c := quantConfig()
	m, err := NewModel[float32](c)
	if err != nil {
		t.Fatal(err)
	}
	m.InitRandom(1)
	tokens := randomTokens(rand.New(rand.NewPCG(4, 5)), c, 2, 64)
	base := Options{BF16: true}
	dev := map[string]*Deviation{}
	for _, name := range []string{"mxfp8", "nvfp4"} {
		r, err := quant.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		o := base
		o.Quantize = quant.NewGEMMs(r, true, true, false, c.Layers, 1)
		_, d, err := m.CompareHF(tokens, &base, o)
		if err != nil {
			t.Fatal(err)
		}
		dev[name] = d
		t.Logf("%s: loss %.6f vs bf16 %.6f, gradient relative L2 %.4f, cosine %.5f", name, d.Loss, d.BaseLoss, d.GradRelL2, d.GradCosine)
	}
	mx, nv := dev["mxfp8"], dev["nvfp4"]
	if !(mx.GradRelL2 > 0 && mx.GradRelL2 < 0.2) {
		t.Errorf("MXFP8 gradient deviation %v: want in (0, 0.2)", mx.GradRelL2)
	}
	if !(nv.GradRelL2 > mx.GradRelL2) {
		t.Errorf("NVFP4 gradient deviation %v not above MXFP8's %v", nv.GradRelL2, mx.GradRelL2)
	}
	if math.Abs(nv.Loss-nv.BaseLoss) > 0.1*nv.BaseLoss {
		t.Errorf("NVFP4 loss %v far from BF16's %v", nv.Loss, nv.BaseLoss)
	}
}

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}
