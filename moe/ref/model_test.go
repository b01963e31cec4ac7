package ref

import (
	"fmt"
	"github.com/moescope/moescope/moe"
	"math"
	"math/rand/v2"
	"testing"
)

// tinyVariants are small configs covering every architectural option the
// reference implements (each a Config literal, not a built-in).
func tinyVariants() map[string]*moe.Config {
	base := func() *moe.Config {
		return &moe.Config{Name: "tiny", ModelType: "qwen3_moe", Vocab: 13, Hidden: 8, Layers: 2, Heads: 4, KVHeads: 2,
			HeadDim: 4, DenseFFN: 6, MoELayer: []bool{true, true}, Window: []int{0, 0}, Experts: 4, TopK: 2,
			ExpertFFN: 5, Score: moe.Softmax, RoutedScale: 1, Groups: 1, TopKGroups: 1, NormTopK: true,
			QKNorm: moe.QKNormHead, RotaryFraction: 1, RopeTheta: 10000, NormEps: 1e-6, InitRange: 0.5}
	}
	vs := map[string]*moe.Config{}
	q3 := base()
	vs["qwen3_moe"] = q3

	q2 := base()
	q2.ModelType = "qwen2_moe"
	q2.QKNorm, q2.QKVBias, q2.NormTopK = moe.QKNormNone, true, false
	q2.SharedExperts, q2.SharedFFN, q2.SharedGated = 1, 7, true
	q2.Names.Shared = "shared_expert"
	q2.Layers, q2.MoELayer, q2.Window = 3, []bool{true, false, true}, []int{0, 0, 0}
	vs["qwen2_moe"] = q2

	glm := base()
	glm.ModelType = "glm4_moe"
	glm.QKNorm = moe.QKNormNone
	glm.Score, glm.SelectionBias, glm.RoutedScale, glm.NormTopKEps = moe.Sigmoid, true, 2.5, 1e-20
	glm.IgnoreExtraLayers = true
	glm.Experts, glm.Groups, glm.TopKGroups, glm.TopK = 6, 3, 2, 3
	glm.RotaryFraction = 0.5
	glm.SharedExperts, glm.SharedFFN = 2, 3
	glm.MoELayer = []bool{false, true}
	glm.TiedEmbeddings = true
	vs["glm4_moe"] = glm

	ol := base()
	ol.ModelType = "olmoe"
	ol.QKNorm, ol.NormTopK = moe.QKNormFull, false
	ol.Window = []int{3, 0}
	ol.KVHeads = 4
	vs["olmoe_window"] = ol

	mx := base()
	mx.ModelType = "mixtral"
	mx.QKNorm = moe.QKNormNone
	mx.Heads, mx.KVHeads = 2, 1
	mx.Window = []int{2, 2}
	mx.Names = moe.TensorNames{MoE: "block_sparse_moe", ExpertGate: "w1", ExpertUp: "w3", ExpertDown: "w2"}
	vs["mixtral"] = mx

	ds := base()
	ds.ModelType = "deepseek"
	ds.QKNorm, ds.NormTopK = moe.QKNormNone, false
	ds.SharedExperts, ds.SharedFFN = 2, 3
	ds.Experts, ds.TopK = 5, 3
	ds.NormTopKEps, ds.SeqAuxLoss = 1e-20, true
	vs["deepseek"] = ds

	dn := base()
	dn.ModelType = "qwen3"
	dn.MoELayer = []bool{false, false}
	dn.Experts, dn.TopK, dn.ExpertFFN = 0, 0, 0
	dn.TiedEmbeddings = true
	vs["dense"] = dn
	vs["gpt_oss"] = gptOSSVariant(base())
	un := gptOSSVariant(base())
	un.FusedExperts = false // biased per-expert modules: the unfused views and biases
	vs["gpt_oss_unfused"] = un
	vs["llama4"] = llama4Variant(base())
	return vs
}

func randomTokens(r *rand.Rand, c *moe.Config, batch, seq int) [][]int {
	ts := make([][]int, batch)
	for i := range ts {
		ts[i] = make([]int, seq+1)
		for j := range ts[i] {
			ts[i][j] = r.IntN(c.Vocab)
		}
	}
	return ts
}

// newTestModel builds a float64 model with random weights; selection
// biases, linear biases and attention sinks get random values so that they
// matter.
func newTestModel(t testing.TB, c *moe.Config, seed uint64) *Model[float64] {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	m, err := NewModel[float64](c)
	if err != nil {
		t.Fatal(err)
	}
	m.InitRandom(seed)
	r := rand.New(rand.NewPCG(seed, 7))
	for i, p := range m.Params {
		if p.Buffer || len(p.Shape) == 1 && p.Group != moe.GroupNorm { // biases and sinks too
			for j := range m.Tensors()[i] {
				m.Tensors()[i][j] = 0.3 * r.NormFloat64()
			}
		}
	}
	return m
}

// routingMargin is the smallest gap, over all tokens and MoE layers,
// between the K-th selected expert's choice score and the best unselected
// one, in the same terms routeSelect ranks them; finite differences are
// valid only when perturbations stay far below it.
func routingMargin(c *moe.Config, m *Model[float64], tokens [][]int) float64 {
	margin := math.Inf(1)
	w, _ := layerViews(c, m.Params, m.Tensors())
	batch, seq := len(tokens), len(tokens[0])-1
	// run forward block by block to inspect routing
	x := make([]float64, batch*seq*c.Hidden)
	for i, s := range tokens {
		for j := 0; j < seq; j++ {
			copy(x[(i*seq+j)*c.Hidden:], w.global.Embed[s[j]*c.Hidden:(s[j]+1)*c.Hidden])
		}
	}
	for l := 0; l < c.Layers; l++ {
		b := NewBlock[float64](c, l, batch, seq, Options{})
		x = b.Forward(&w.layers[l], x)
		rt := b.Routing()
		if rt == nil {
			continue
		}
		E, K := rt.Experts, rt.K
		for t := 0; t < rt.Tokens; t++ {
			ch := make([]float64, E)
			copy(ch, rt.Scores[t*E:t*E+E])
			if w.layers[l].SelBias != nil {
				for e := range ch {
					ch[e] += w.layers[l].SelBias[e]
				}
			}
			sel := map[int]bool{}
			lo := math.Inf(1)
			for _, e := range rt.Indices[t*K : t*K+K] {
				sel[int(e)] = true
				lo = min(lo, ch[e])
			}
			for e := 0; e < E; e++ {
				if !sel[e] {
					margin = min(margin, math.Abs(lo-ch[e]))
				}
			}
		}
	}
	return margin
}

// TestGradientsFiniteDifferences checks every parameter element's analytic
// gradient against the central difference (f(θ+h) − f(θ−h))/2h of the
// training loss (cross-entropy + coef·aux) in float64, for every variant.
func TestGradientsFiniteDifferences(t *testing.T) {
	for name, c := range tinyVariants() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := newTestModel(t, c, 11)
			r := rand.New(rand.NewPCG(3, 4))
			tokens := randomTokens(r, c, 2, 5)
			o := Options{TileQ: 2, TileK: 3}
			if c.IsMoE() && CheckAux(c) == nil {
				o.AuxCoef = 0.3
			}
			if c.IsMoE() {
				if mg := routingMargin(c, m, tokens); mg < 1e-4 {
					t.Fatalf("routing margin %g too small for finite differences: pick another seed", mg)
				}
			}
			if _, err := m.ForwardBackward(tokens, 1, o); err != nil {
				t.Fatal(err)
			}
			grad := append([]float64(nil), m.Grad...)
			const h = 1e-6
			loss := func() float64 {
				r, err := m.Evaluate(tokens, o)
				if err != nil {
					t.Fatal(err)
				}
				return r.Total
			}
			worst := 0.0
			for i, p := range m.Params {
				if p.Buffer {
					continue
				}
				lo := m.offs[i]
				n := m.offs[i+1] - lo
				// every element of small tensors, a spread of 16 of large ones
				step := max(1, n/16)
				for j := 0; j < n; j += step {
					k := lo + j
					orig := m.Data[k]
					m.Data[k] = orig + h
					fp := loss()
					m.Data[k] = orig - h
					fm := loss()
					m.Data[k] = orig
					fd := (fp - fm) / (2 * h)
					err := math.Abs(fd - grad[k])
					tol := 1e-7 + 1e-5*math.Max(math.Abs(fd), math.Abs(grad[k]))
					worst = max(worst, err/tol)
					if err > tol {
						t.Errorf("%s[%d]: analytic %.10g, finite difference %.10g", p.Name, j, grad[k], fd)
					}
				}
			}
			t.Logf("worst error/tolerance %.3g", worst)
		})
	}
}

// TestGradientGroupsCovered makes sure the finite-difference variants
// exercise every parameter group with a non-zero gradient.
func TestGradientGroupsCovered(t *testing.T) {
	seen := map[moe.ParamGroup]bool{}
	for _, c := range tinyVariants() {
		m := newTestModel(t, c, 11)
		tokens := randomTokens(rand.New(rand.NewPCG(3, 4)), c, 2, 5)
		if _, err := m.ForwardBackward(tokens, 1, Options{AuxCoef: 0}); err != nil {
			t.Fatal(err)
		}
		for i, p := range m.Params {
			for _, g := range m.Grads()[i] {
				if g != 0 {
					seen[p.Group] = true
				}
			}
		}
	}
	for _, g := range moe.Groups() {
		if !seen[g] {
			t.Errorf("no variant gives group %s a gradient", g)
		}
	}
}

func ExampleModel() {
	c := tinyVariants()["qwen3_moe"]
	m, err := NewModel[float32](c)
	if err != nil {
		panic(err)
	}
	m.InitRandom(1)
	res, err := m.Accumulate([][][]int{{{1, 2, 3, 4}}, {{4, 3, 2, 1}}}, Options{AC: moe.AC{Mode: moe.ACSelective}})
	if err != nil {
		panic(err)
	}
	m.Step(DefaultAdamW)
	fmt.Println(res.Tokens, res.Loss > 0)
	// Output: 6 true
}
