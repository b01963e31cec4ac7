package ref_test

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/moe/ref"
)

// TestPoliciesBitwiseEqual runs the same micro-batches under every
// checkpointing policy and demands bit-identical losses and gradients, in
// float32 and float64, with and without bf16 rounding.
func TestPoliciesBitwiseEqual(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for i := 0; i < 10; i++ {
		c := moetest.Config(r)
		tokens := moetest.Tokens(r, c, 1+r.IntN(2), 2+r.IntN(5))
		o := ref.Options{TileQ: 1 + r.IntN(3), TileK: 1 + r.IntN(3), BF16: i%3 == 0}
		if c.IsMoE() && ref.CheckAux(c) == nil {
			o.AuxCoef = 0.01
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			policyEqual[float32](t, c, tokens, o)
			policyEqual[float64](t, c, tokens, o)
		})
	}
}

func policyEqual[T ref.Float](t *testing.T, c *moe.Config, tokens [][]int, o ref.Options) {
	var none []T
	var noneLoss float64
	for _, ac := range moetest.Policies() {
		m, err := ref.NewModel[T](c)
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
			t.Errorf("%s %T %s: Evaluate gives %v (%v), ForwardBackward %v", c.ModelType, T(0), ac, ev.Total, err, res.Total)
		}
		if none == nil {
			none, noneLoss = m.Grad, res.Total
			continue
		}
		if res.Total != noneLoss {
			t.Errorf("%s %T %s: loss %v, none gives %v", c.ModelType, T(0), ac, res.Total, noneLoss)
		}
		for i := range none {
			if math.Float64bits(float64(m.Grad[i])) != math.Float64bits(float64(none[i])) {
				t.Errorf("%s %T %s: grad[%d] = %v, none gives %v", c.ModelType, T(0), ac, i, m.Grad[i], none[i])
				break
			}
		}
	}
}

// compareSaved orders saved records by every field.
func compareSaved(a, b moe.SavedRecord) int {
	return cmp.Or(cmp.Compare(a.Layer, b.Layer), cmp.Compare(a.Op, b.Op), cmp.Compare(a.Tensor, b.Tensor),
		cmp.Compare(a.Elements, b.Elements), cmp.Compare(a.DType, b.DType))
}

// TestSavedMatchesTable checks that what execution keeps is exactly
// SavedTensors, layer by layer, for random configs and every policy.
func TestSavedMatchesTable(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for i := 0; i < 25; i++ {
		c := moetest.Config(r)
		batch, seq := 1+r.IntN(2), 2+r.IntN(5)
		tokens := moetest.Tokens(r, c, batch, seq)
		for _, ac := range moetest.Policies() {
			m, err := ref.NewModel[float32](c)
			if err != nil {
				t.Fatal(err)
			}
			m.InitRandom(1)
			rec := &moetest.Recorder{}
			if _, err := m.ForwardBackward(tokens, 1, ref.Options{AC: ac, Recorder: rec}); err != nil {
				t.Fatal(err)
			}
			got := rec.Saved
			var want []moe.SavedRecord
			for l := moe.LayerEmbed; l <= c.LayerHead(); l++ {
				want = append(want, moe.SavedTensors(c, l, batch, seq, ac, moe.Precision{})...)
			}
			slices.SortFunc(got, compareSaved)
			slices.SortFunc(want, compareSaved)
			if !slices.Equal(got, want) {
				t.Fatalf("config %d (%s) %s: recorded saved tensors\n%v\nwant\n%v", i, c.ModelType, ac, got, want)
			}
		}
	}
}

// TestRecomputeRepeatsForward checks the recompute records against the
// forward ones: full checkpointing repeats every forward op of the block,
// selective and memory_budget every one but the cached linears and
// attention (those whose output SavedTensors lists), modules the named modules' ops
// (moe every op of the MoE layer, moe with moe_act the activation twice);
// every policy adds the flash backward's n·d_qk.
func TestRecomputeRepeatsForward(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for i := 0; i < 17; i++ {
		c := moetest.Config(r)
		batch, seq := 1+r.IntN(2), 2+r.IntN(5)
		tokens := moetest.Tokens(r, c, batch, seq)
		o := ref.Options{TileQ: 1 + r.IntN(3), TileK: 1 + r.IntN(3)}
		if c.IsMoE() && ref.CheckAux(c) == nil && r.IntN(2) == 0 {
			o.AuxCoef = 0.1
		}
		for _, ac := range moetest.Policies() {
			// The ops whose output a caching policy keeps (linears, attention).
			cached := map[moetest.OpKey]bool{}
			for l := range c.Layers {
				for _, s := range moe.SavedTensors(c, l, batch, seq, ac, moe.Precision{}) {
					if ac.Caches() && s.Tensor == moe.SavedOutput && (s.Op.Kind() == moe.KindMatmul || s.Op == moe.OpAttn) {
						cached[moetest.OpKey{Layer: l, Op: s.Op, Pass: moe.Forward}] = true
					}
				}
			}
			m, err := ref.NewModel[float32](c)
			if err != nil {
				t.Fatal(err)
			}
			m.InitRandom(1)
			rec := &moetest.Recorder{}
			o.AC, o.Recorder = ac, rec
			if _, err := m.ForwardBackward(tokens, 1, o); err != nil {
				t.Fatal(err)
			}
			sum := moetest.OpSums(rec.Ops)
			for k, fwd := range sum {
				if k.Pass != moe.Forward || k.Layer < 0 || k.Layer >= c.Layers || k.Op == moe.OpAuxLoss {
					continue
				}
				want := int64(0)
				switch {
				case ac.FullyCheckpointed(k.Layer):
					want = fwd
				case ac.Caches() && !cached[k]:
					want = fwd
				case ac.Mode == moe.ACModules:
					// Megatron's TE layer spec: separate (recomputable)
					// norms are MoE blocks' pre-MLP norm and MLA's input
					// norm; moe_act is the routed experts' activation.
					norm := (k.Op == moe.OpFFNNorm && c.MoELayer[k.Layer]) || (k.Op == moe.OpAttnNorm && c.IsMLA())
					if (norm && ac.Modules&moe.RecomputeLayerNorm != 0) || (k.Op == moe.OpExpertAct && ac.Modules&moe.RecomputeMoEAct != 0) {
						want = fwd
					}
					// moe: Megatron's MoELayer.forward, the ops between the
					// pre-MLP norm and the residual add, once more; its
					// activation once more again under moe_act.
					inMoE := false
					switch k.Op {
					case moe.OpRouter, moe.OpRouterTopK, moe.OpDispatch, moe.OpExpertGate, moe.OpExpertUp, moe.OpExpertAct,
						moe.OpExpertDown, moe.OpCombine, moe.OpSharedGate, moe.OpSharedUp, moe.OpSharedAct, moe.OpSharedDown,
						moe.OpSharedExpGate, moe.OpSharedScale:
						inMoE = c.MoELayer[k.Layer]
					}
					if inMoE && ac.Modules&moe.RecomputeMoE != 0 {
						want += fwd
					}
				}
				if k.Op == moe.OpAttn {
					// flash backward's QKᵀ: n·d_qk of the forward's n·(d_qk + d_v)
					want += fwd * int64(c.HeadDim) / int64(c.HeadDim+c.VHeadDim())
				}
				rk := k
				rk.Pass = moe.Recompute
				if got := sum[rk]; got != want {
					t.Errorf("config %d (%s) %s layer %d %s: recompute %d, want %d", i, c.ModelType, ac, k.Layer, k.Op, got, want)
				}
			}
		}
	}
}

// TestStepRecorded checks the optimizer records cover every trained
// parameter once (buffers excluded) and that Step matches AdamWStep.
func TestStepRecorded(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	c := moetest.ConfigOf(r, "glm4_moe") // has a selection-bias buffer
	m, err := ref.NewModel[float64](c)
	if err != nil {
		t.Fatal(err)
	}
	m.InitRandom(3)
	for i, p := range m.Params {
		if p.Buffer {
			for j := range m.Tensors()[i] {
				m.Tensors()[i][j] = 0.3 * r.NormFloat64()
			}
		}
	}
	if _, err := m.ForwardBackward(moetest.Tokens(r, c, 1, 4), 1, ref.Options{}); err != nil {
		t.Fatal(err)
	}
	ts, gs := m.Tensors(), m.Grads() // views of Data and Grad, in Params order
	before := make([][]float64, len(ts))
	for i := range ts {
		before[i] = slices.Clone(ts[i])
	}
	rec := &moetest.Recorder{}
	m.StepRecorded(ref.DefaultAdamW, rec)
	var n, want int64
	for _, x := range rec.Ops {
		n += x.Count
	}
	for i, p := range m.Params {
		if p.Buffer {
			if !slices.Equal(ts[i], before[i]) {
				t.Fatalf("buffer %s changed", p.Name)
			}
			continue
		}
		want += p.Elements()
		var st ref.AdamState[float64]
		ref.AdamWStep(ref.DefaultAdamW, &st, before[i], gs[i])
		for j, v := range before[i] {
			if ts[i][j] != v {
				t.Fatalf("%s[%d] = %v, AdamWStep gives %v", p.Name, j, ts[i][j], v)
			}
		}
	}
	if n != want {
		t.Errorf("optimizer records count %d parameters, model trains %d", n, want)
	}
}
