package moe

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// randomConfig draws a small valid config mixing every option.
func randomConfig(r *rand.Rand) *Config {
	c := &Config{Name: "rand", ModelType: "qwen3_moe", RoutedScale: 1, Groups: 1, TopKGroups: 1,
		RopeTheta: 10000, NormEps: 1e-6, InitRange: 0.3, RotaryFraction: 1}
	c.Vocab = 5 + r.IntN(12)
	c.Hidden = 4 + r.IntN(6)
	c.Layers = 1 + r.IntN(3)
	c.KVHeads = 1 + r.IntN(2)
	c.Heads = c.KVHeads * (1 + r.IntN(2))
	c.HeadDim = 2 * (1 + r.IntN(3))
	c.DenseFFN = 2 + r.IntN(5)
	c.MoELayer, c.Window = make([]bool, c.Layers), make([]int, c.Layers)
	for l := range c.MoELayer {
		c.MoELayer[l] = r.IntN(4) != 0
		if r.IntN(3) == 0 {
			c.Window[l] = 1 + r.IntN(4)
		}
	}
	if c.MoELayers() > 0 {
		c.Experts = 2 + r.IntN(5)
		c.TopK = 1 + r.IntN(c.Experts)
		c.ExpertFFN = 2 + r.IntN(4)
		c.Score = Softmax
		c.NormTopK = r.IntN(2) == 0
		if r.IntN(3) == 0 {
			c.Score, c.SelectionBias = Sigmoid, r.IntN(2) == 0
			c.RoutedScale = 0.5 + r.Float64()*2
			if c.Experts%2 == 0 && r.IntN(2) == 0 {
				c.Groups, c.TopKGroups = 2, 1+r.IntN(2)
				c.TopK = 1 + r.IntN(c.TopKGroups*c.Experts/2)
			}
		}
		if r.IntN(2) == 0 {
			c.SharedExperts, c.SharedFFN = 1+r.IntN(2), 2+r.IntN(3)
			c.SharedGated = r.IntN(2) == 0
		}
	}
	c.QKNorm = []QKNorm{QKNormNone, QKNormHead, QKNormFull}[r.IntN(3)]
	c.QKVBias = r.IntN(2) == 0
	if c.HeadDim >= 4 && r.IntN(2) == 0 {
		c.RotaryFraction = 0.5
	}
	c.TiedEmbeddings = r.IntN(2) == 0
	return c
}

var testPolicies = []AC{{Mode: ACNone}, {Mode: ACSelective}, {Mode: ACFull}, {Mode: ACLayer, Every: 1}, {Mode: ACLayer, Every: 2}}

// collector is a Recorder that keeps everything.
type collector struct {
	ops   []OpRecord
	saved []SavedRecord
}

func (c *collector) RecordOp(r OpRecord)       { c.ops = append(c.ops, r) }
func (c *collector) RecordSaved(r SavedRecord) { c.saved = append(c.saved, r) }

func savedKey(s SavedRecord) string {
	return fmt.Sprintf("%d/%s/%s/%d/%s", s.Layer, s.Op, s.Tensor, s.Elements, s.DType)
}

// TestPoliciesBitwiseEqual runs the same micro-batches under every
// checkpointing policy and demands bit-identical losses and gradients, in
// float32 and float64, with and without bf16 rounding.
func TestPoliciesBitwiseEqual(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for i := 0; i < 12; i++ {
		c := randomConfig(r)
		tokens := randomTokens(r, c, 1+r.IntN(2), 2+r.IntN(5))
		o := Options{TileQ: 1 + r.IntN(3), TileK: 1 + r.IntN(3), BF16: i%3 == 0}
		if c.IsMoE() && c.Score == Softmax {
			o.AuxCoef = 0.01
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			policyEqual[float32](t, c, tokens, o)
			policyEqual[float64](t, c, tokens, o)
		})
	}
}

func policyEqual[T Float](t *testing.T, c *Config, tokens [][]int, o Options) {
	var ref []T
	var refLoss float64
	for _, ac := range testPolicies {
		m, err := NewModel[T](c)
		if err != nil {
			t.Fatal(err)
		}
		m.InitRandom(5)
		o.AC = ac
		res, err := m.ForwardBackward(tokens, 1, o)
		if err != nil {
			t.Fatal(err)
		}
		if ev, err := m.Evaluate(tokens, o); err != nil || ev.Total != res.Total {
			t.Errorf("%T %s: Evaluate gives %v (%v), ForwardBackward %v", T(0), ac, ev.Total, err, res.Total)
		}
		if ref == nil {
			ref, refLoss = m.Grad, res.Total
			continue
		}
		if res.Total != refLoss {
			t.Errorf("%T %s: loss %v, none gives %v", T(0), ac, res.Total, refLoss)
		}
		for i := range ref {
			if math.Float64bits(float64(m.Grad[i])) != math.Float64bits(float64(ref[i])) {
				t.Errorf("%T %s: grad[%d] = %v, none gives %v", T(0), ac, i, m.Grad[i], ref[i])
				break
			}
		}
	}
}

// TestSavedMatchesTable checks that what execution keeps is exactly
// SavedTensors, layer by layer, for random configs and every policy.
func TestSavedMatchesTable(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for i := 0; i < 25; i++ {
		c := randomConfig(r)
		batch, seq := 1+r.IntN(2), 2+r.IntN(5)
		tokens := randomTokens(r, c, batch, seq)
		for _, ac := range testPolicies {
			m, err := NewModel[float32](c)
			if err != nil {
				t.Fatal(err)
			}
			m.InitRandom(1)
			rec := &collector{}
			if _, err := m.ForwardBackward(tokens, 1, Options{AC: ac, Recorder: rec}); err != nil {
				t.Fatal(err)
			}
			var got, want []string
			for _, s := range rec.saved {
				got = append(got, savedKey(s))
			}
			for l := LayerEmbed; l <= c.LayerHead(); l++ {
				for _, s := range SavedTensors(c, l, batch*seq, ac, Precision{}) {
					want = append(want, savedKey(s))
				}
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("config %d %s: recorded saved tensors\n%v\nwant\n%v", i, ac, got, want)
			}
		}
	}
}

// TestRecomputeRepeatsForward checks the recompute records against the
// forward ones: full checkpointing repeats every forward op of the block,
// selective every one but the saved linears and attention; every policy
// adds the flash backward's n·d.
func TestRecomputeRepeatsForward(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for i := 0; i < 20; i++ {
		c := randomConfig(r)
		batch, seq := 1+r.IntN(2), 2+r.IntN(5)
		tokens := randomTokens(r, c, batch, seq)
		o := Options{TileQ: 1 + r.IntN(3), TileK: 1 + r.IntN(3)}
		if c.IsMoE() && c.Score == Softmax && r.IntN(2) == 0 {
			o.AuxCoef = 0.1
		}
		for _, ac := range testPolicies {
			m, err := NewModel[float32](c)
			if err != nil {
				t.Fatal(err)
			}
			m.InitRandom(1)
			rec := &collector{}
			o.AC, o.Recorder = ac, rec
			if _, err := m.ForwardBackward(tokens, 1, o); err != nil {
				t.Fatal(err)
			}
			type key struct {
				l  int
				op Op
				p  Pass
			}
			sum := map[key]int64{}
			for _, x := range rec.ops {
				sum[key{x.Layer, x.Op, x.Pass}] += x.Count
			}
			for k, fwd := range sum {
				if k.p != Forward || k.l < 0 || k.l >= c.Layers || k.op == OpAuxLoss {
					continue
				}
				want := int64(0)
				switch {
				case ac.FullyCheckpointed(k.l):
					want = fwd
				case ac.Mode == ACSelective && k.op != OpAttn && !slices.Contains(selectiveSaved(c, k.l), k.op):
					want = fwd
				}
				if k.op == OpAttn {
					want += fwd / 2 // flash backward's QKᵀ
				}
				if got := sum[key{k.l, k.op, Recompute}]; got != want {
					t.Errorf("config %d %s layer %d %s: recompute %d, want %d", i, ac, k.l, k.op, got, want)
				}
			}
		}
	}
}
