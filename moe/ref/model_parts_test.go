package ref

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/safetensors"
)

// TestAdamWMatchesTorch compares three AdamW steps with torch.optim.AdamW
// (torch 1.13, float64): p = [1, −2], lr 0.1, betas (0.9, 0.999), eps 1e-8,
// weight_decay 0.01, gradients [0.5, 0.25], [−1, 3], [0, −0.125]. Step 1
// by hand: p = 1·(1 − 0.001) − 0.1·0.05/0.1 / (√0.00025/√0.001 + 1e-8)
// = 0.999 − 0.1/(1 + 2e-8) = 0.899000002.
func TestAdamWMatchesTorch(t *testing.T) {
	a := AdamW{LR: 0.1, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01}
	p := []float64{1, -2}
	var st AdamState[float64]
	grads := [][]float64{{0.5, 0.25}, {-1, 3}, {0, -0.125}}
	want := [][]float64{ // printed by torch.optim.AdamW
		{0.899000002, -2.097999996},
		{0.9347113542385653, -2.175620657993052},
		{0.9620765511939501, -2.232363107831355},
	}
	for s, g := range grads {
		AdamWStep(a, &st, p, g)
		for i := range p {
			if math.Abs(p[i]-want[s][i]) > 1e-14 {
				t.Errorf("step %d p[%d] = %.17g, torch %.17g", s+1, i, p[i], want[s][i])
			}
		}
	}
}

// TestFloat32AgreesWithFloat64 runs the same model in both precisions.
func TestFloat32AgreesWithFloat64(t *testing.T) {
	for name, c := range tinyVariants() {
		m64 := newTestModel(t, c, 11)
		m32, err := NewModel[float32](c)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range m64.Data {
			m32.Data[i] = float32(v)
		}
		tokens := randomTokens(rand.New(rand.NewPCG(3, 4)), c, 2, 5)
		r64, err := m64.ForwardBackward(tokens, 1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		r32, err := m32.ForwardBackward(tokens, 1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(r32.Loss-r64.Loss) > 1e-5*r64.Loss {
			t.Errorf("%s: loss float32 %v, float64 %v", name, r32.Loss, r64.Loss)
		}
		var gmax, dmax float64
		for i, g := range m64.Grad {
			gmax = max(gmax, math.Abs(g))
			dmax = max(dmax, math.Abs(g-float64(m32.Grad[i])))
		}
		if dmax > 1e-4*gmax {
			t.Errorf("%s: gradients differ by %g (max |g| %g)", name, dmax, gmax)
		}
	}
}

// TestBF16Rounding checks the bf16 option changes the loss slightly and
// that every saved activation it produces is a bf16 value.
func TestBF16Rounding(t *testing.T) {
	c := tinyVariants()["qwen2_moe"]
	m := newTestModel(t, c, 11)
	tokens := randomTokens(rand.New(rand.NewPCG(3, 4)), c, 2, 5)
	exact, _ := m.ForwardBackward(tokens, 1, Options{})
	b := NewBlock[float64](c, 0, 2, 5, Options{BF16: true})
	w, _ := layerViews(c, m.Params, m.Tensors())
	x := make([]float64, 10*c.Hidden)
	for i := range x {
		x[i] = float64(safetensors.BF16ToFloat32(safetensors.Float32ToBF16(float32(math.Sin(float64(i))))))
	}
	out := b.Forward(&w.layers[0], x)
	for _, v := range append(append([]float64(nil), out...), b.st.h2...) {
		if float64(safetensors.BF16ToFloat32(safetensors.Float32ToBF16(float32(v)))) != v {
			t.Fatalf("bf16 run produced %v, not a bf16 value", v)
		}
	}
	m.ZeroGrad()
	r, err := m.ForwardBackward(tokens, 1, Options{BF16: true})
	if err != nil {
		t.Fatal(err)
	}
	if d := math.Abs(r.Loss - exact.Loss); d == 0 || d > 0.02*exact.Loss {
		t.Errorf("bf16 loss %v vs exact %v: want a small non-zero difference", r.Loss, exact.Loss)
	}
}

// splitExperts is an ExpertStage that runs experts [0, E/2) and [E/2, E)
// as two separate "ranks": two local stages over disjoint rows, each seeing
// only its own experts' weights (the others nil), the way an
// expert-parallel implementation holds them.
type splitExperts[T Float] struct {
	b    *Block[T]
	w, g *LayerWeights[T]
	half [2]localExperts[T]
	rows [2]int
}

// own returns a copy of lw whose experts outside [lo, hi) are nil.
func own[T Float](lw *LayerWeights[T], lo, hi int) *LayerWeights[T] {
	c := *lw
	c.ExpGate, c.ExpUp, c.ExpDown = make([][]T, len(lw.ExpGate)), make([][]T, len(lw.ExpGate)), make([][]T, len(lw.ExpGate))
	for e := lo; e < hi; e++ {
		c.ExpGate[e], c.ExpUp[e], c.ExpDown[e] = lw.ExpGate[e], lw.ExpUp[e], lw.ExpDown[e]
	}
	return &c
}

func (s *splitExperts[T]) ExpertsForward(layer int, xe []T, counts []int, pass moe.Pass, keep bool) []T {
	D, E := s.b.cfg.Hidden, len(counts)
	var out []T
	start := 0
	for h := 0; h < 2; h++ {
		c := make([]int, E)
		lo, hi := h*E/2, (h+1)*E/2
		n := 0
		for e := lo; e < hi; e++ {
			c[e] = counts[e]
			n += counts[e]
		}
		s.half[h] = localExperts[T]{b: s.b, w: own(s.w, lo, hi), g: own(s.g, lo, hi)}
		out = append(out, s.half[h].ExpertsForward(layer, xe[start*D:(start+n)*D], c, pass, keep)...)
		s.rows[h] = n
		start += n
	}
	return out
}

func (s *splitExperts[T]) ExpertsBackward(layer int, dye []T) []T {
	D := s.b.cfg.Hidden
	var dx []T
	start := 0
	for h := 0; h < 2; h++ {
		dx = append(dx, s.half[h].ExpertsBackward(layer, dye[start*D:(start+s.rows[h])*D])...)
		start += s.rows[h]
	}
	return dx
}

// TestExpertStageSeam drives a block with an ExpertStage that splits the
// experts in two and checks output and gradients equal the local run bit
// for bit, under none, full and selective checkpointing, in both precisions.
func TestExpertStageSeam(t *testing.T) {
	seam[float64](t)
	seam[float32](t)
}

func seam[T Float](t *testing.T) {
	c := tinyVariants()["qwen3_moe"]
	m, _ := NewModel[T](c)
	m.InitRandom(11)
	w, _ := layerViews(c, m.Params, m.Tensors())
	x := make([]T, 10*c.Hidden)
	r := rand.New(rand.NewPCG(9, 9))
	for i := range x {
		x[i] = T(r.NormFloat64())
	}
	dy := make([]T, len(x))
	for i := range dy {
		dy[i] = T(r.NormFloat64())
	}
	for _, ac := range []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACFull}, {Mode: moe.ACSelective}} {
		run := func(split bool) ([]T, []T, []T) {
			gm, _ := NewModel[T](c)
			g, _ := layerViews(c, gm.Params, gm.Grads())
			b := NewBlock[T](c, 0, 2, 5, Options{AC: ac})
			if split {
				b.Experts = &splitExperts[T]{b: b, w: &w.layers[0], g: &g.layers[0]}
			}
			out := b.Forward(&w.layers[0], x)
			dx := b.Backward(&w.layers[0], &g.layers[0], dy, nil)
			return out, dx, gm.Grad
		}
		o1, d1, g1 := run(false)
		o2, d2, g2 := run(true)
		for _, p := range [][2][]T{{o1, o2}, {d1, d2}, {g1, g2}} {
			for i := range p[0] {
				if p[0][i] != p[1][i] {
					t.Fatalf("%T %s: split experts differ at %d: %v vs %v", T(0), ac, i, p[0][i], p[1][i])
				}
			}
		}
	}
}

// TestBadTokens checks the errors for malformed micro-batches.
func TestBadTokens(t *testing.T) {
	c := tinyVariants()["qwen3_moe"]
	m, _ := NewModel[float32](c)
	for _, tc := range []struct {
		tokens [][]int
		want   string
	}{
		{nil, "empty"},
		{[][]int{{1}}, "at least 2"},
		{[][]int{{1, 2, 3}, {1, 2}}, "equal length"},
		{[][]int{{1, 13}}, "vocab = 13"},
		{[][]int{{-1, 2}}, "tokens[0][0] = -1"},
	} {
		_, err := m.ForwardBackward(tc.tokens, 1, Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want it to mention %q", tc.tokens, err, tc.want)
		}
	}
	s := *c
	s.Score = moe.Sigmoid
	ms, _ := NewModel[float32](&s)
	if _, err := ms.ForwardBackward([][]int{{1, 2}}, 1, Options{AuxCoef: 0.1}); err == nil {
		t.Error("aux loss on a sigmoid router: no error")
	}
}

// TestAccumulateIsMean checks gradient accumulation: Accumulate over two
// micro-batches gives the mean of their losses and of their gradients.
func TestAccumulateIsMean(t *testing.T) {
	c := tinyVariants()["qwen2_moe"]
	m := newTestModel(t, c, 4)
	r := rand.New(rand.NewPCG(8, 8))
	mb := [][][]int{randomTokens(r, c, 2, 4), randomTokens(r, c, 2, 4)}
	o := Options{AuxCoef: 0.1}
	var g [2][]float64
	var l [2]float64
	for i := range mb {
		m.ZeroGrad()
		res, err := m.ForwardBackward(mb[i], 1, o)
		if err != nil {
			t.Fatal(err)
		}
		g[i], l[i] = append([]float64(nil), m.Grad...), res.Total
	}
	res, err := m.Accumulate(mb, o)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(res.Total-(l[0]+l[1])/2) > 1e-14 {
		t.Errorf("mean loss %v, want %v", res.Total, (l[0]+l[1])/2)
	}
	for i, v := range m.Grad {
		if want := (g[0][i] + g[1][i]) / 2; math.Abs(v-want) > 1e-14*(1+math.Abs(want)) {
			t.Fatalf("grad[%d] = %v, mean of micro-batches %v", i, v, want)
		}
	}
}

// TestUpdateSelectionBias checks torchtitan's rule by hand: loads
// [1, 1, 10] (mean 4) give δ = γ·sign(4 − load) = [γ, γ, −γ], centred by
// mean(δ) = γ/3 to [2γ/3, 2γ/3, −4γ/3].
func TestUpdateSelectionBias(t *testing.T) {
	c := tinyVariants()["glm4_moe"]
	c2 := *c
	c2.Experts, c2.Groups, c2.TopKGroups, c2.TopK = 3, 1, 1, 2
	m, err := NewModel[float64](&c2)
	if err != nil {
		t.Fatal(err)
	}
	const g = 0.003
	m.UpdateSelectionBias([][]int64{nil, {1, 1, 10}}, g)
	w, _ := m.Layer(1)
	want := []float64{2 * g / 3, 2 * g / 3, -4 * g / 3}
	for e, v := range w.SelBias {
		if math.Abs(v-want[e]) > 1e-18 {
			t.Errorf("bias[%d] = %v, want %v", e, v, want[e])
		}
	}
}

// TestModulesEmptyRefused: a modules policy with no module is refused by
// the reference (ParseAC never makes one).
func TestModulesEmptyRefused(t *testing.T) {
	c := &moe.Config{Name: "t", ModelType: "llama", Vocab: 8, Hidden: 4, Layers: 1, Heads: 1, KVHeads: 1, HeadDim: 4,
		DenseFFN: 4, MoELayer: []bool{false}, Window: []int{0}, QKNorm: moe.QKNormNone, RotaryFraction: 1, RopeTheta: 10000, NormEps: 1e-6, InitRange: 0.02}
	m, err := NewModel[float32](c)
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.ForwardBackward([][]int{{1, 2, 3}}, 1, Options{AC: moe.AC{Mode: moe.ACModules}})
	if err == nil || !strings.Contains(err.Error(), "at least one module") {
		t.Errorf("empty modules: %v", err)
	}
}
