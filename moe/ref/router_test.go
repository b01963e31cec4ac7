package ref

import (
	"github.com/moescope/moescope/moe"
	"math"
	"math/rand/v2"
	"testing"
)

// FuzzRouting checks routing invariants on random logits: K distinct
// experts per token from at most TopKGroups groups (when every choice score
// is positive), none of them beaten by
// an eligible unselected expert, counts summing to T·K, Order a stable
// permutation sorted by expert, renormalized weights summing to the scale.
func FuzzRouting(f *testing.F) {
	f.Add(uint64(1), uint8(4), uint8(2), uint8(1), false, false)
	f.Add(uint64(2), uint8(6), uint8(3), uint8(3), true, true)
	f.Add(uint64(3), uint8(8), uint8(1), uint8(4), true, false)
	f.Fuzz(func(t *testing.T, seed uint64, e8, k8, g8 uint8, sig, norm bool) {
		E := 1 + int(e8)%12
		K := 1 + int(k8)%E
		G := 1 + int(g8)%E
		if E%G != 0 {
			G = 1
		}
		r := rand.New(rand.NewPCG(seed, 1))
		c := &moe.Config{Score: moe.Softmax, Groups: G, TopKGroups: 1 + r.IntN(G), NormTopK: norm, RoutedScale: 0.5 + r.Float64()}
		if K > c.TopKGroups*E/G {
			K = c.TopKGroups * E / G
		}
		var bias []float64
		if sig {
			c.Score, c.SelectionBias = moe.Sigmoid, true
			bias = make([]float64, E)
			for i := range bias {
				bias[i] = r.NormFloat64()
			}
		}
		const T = 5
		z := make([]float64, T*E)
		for i := range z {
			z[i] = 3 * r.NormFloat64()
		}
		rt := newRouting[float64](T, E, K)
		routeScores(c, rt, z)
		routeSelect(c, rt, bias)
		vals := make([]float64, T*K)
		for tk, e := range rt.Indices {
			vals[tk] = rt.Scores[tk/K*E+int(e)]
		}
		routeWeights(c, rt, vals)
		total := 0
		for _, n := range rt.Counts {
			total += n
		}
		if total != T*K {
			t.Fatalf("counts sum %d, want %d", total, T*K)
		}
		seen := make([]bool, T*K)
		prevE, prevP := -1, int32(-1)
		for _, p := range rt.Order {
			if seen[p] {
				t.Fatalf("order repeats %d", p)
			}
			seen[p] = true
			e := int(rt.Indices[p])
			if e < prevE || (e == prevE && p < prevP) {
				t.Fatalf("order not sorted by expert then position")
			}
			prevE, prevP = e, p
		}
		for tok := 0; tok < T; tok++ {
			ch := make([]float64, E)
			for e := range ch {
				ch[e] = rt.Scores[tok*E+e]
				if bias != nil {
					ch[e] += bias[e]
				}
			}
			idx := rt.Indices[tok*K : tok*K+K]
			sel := map[int]bool{}
			groups := map[int]bool{}
			lo := math.Inf(1)
			for _, e := range idx {
				if e < 0 || int(e) >= E || sel[int(e)] {
					t.Fatalf("token %d: bad or repeated expert %d in %v", tok, e, idx)
				}
				sel[int(e)] = true
				groups[int(e)/(E/G)] = true
				lo = min(lo, ch[e])
			}
			positive := true
			for _, v := range ch {
				positive = positive && v > 0
			}
			// HF masks ineligible groups with 0.0, not −∞: with negative
			// biased scores an expert of a masked group can win, as in HF.
			if positive && len(groups) > c.TopKGroups {
				t.Fatalf("token %d: experts %v span %d groups > %d", tok, idx, len(groups), c.TopKGroups)
			}
			for e := 0; e < E; e++ {
				if !sel[e] && groups[e/(E/G)] && ch[e] > lo && G == 1 {
					t.Fatalf("token %d: unselected expert %d scores %v > selected minimum %v", tok, e, ch[e], lo)
				}
			}
			if norm {
				var s float64
				for _, w := range rt.Weights[tok*K : tok*K+K] {
					s += w
				}
				if math.Abs(s-c.RoutedScale) > 1e-12 {
					t.Fatalf("token %d: weights sum %v, want %v", tok, s, c.RoutedScale)
				}
			}
		}
	})
}
