package rope

import (
	"github.com/moescope/moescope/moe"
	"math"
	"testing"
)

// TestYarnInvFreq: YaRN's inverse frequencies against values derived by
// hand from the formula in Yarn's comment (transformers'
// _compute_yarn_parameters).
func TestYarnInvFreq(t *testing.T) {
	plain := func(r int, theta float64, i int) float64 { return math.Pow(theta, -float64(2*i)/float64(r)) }
	check := func(name string, got []float64, want map[int]float64) {
		t.Helper()
		for i, w := range want {
			if math.Abs(got[i]-w) > 1e-15*math.Abs(w) {
				t.Errorf("%s: inv_freq[%d] = %.17g, want %.17g", name, i, got[i], w)
			}
		}
	}
	// r = 8, θ = 100, original context 64, factor 4, β 32 and 1:
	// dim(32) = 8·ln(64/(64π))/(2 ln 100) = −0.994 → floor −1 → lo = 0;
	// dim(1) = 8·ln(64/(2π))/(2 ln 100) = 2.016 → ceil 3 → hi = 3. The ramp is
	// i/3, so inv_i = f_i·(1 − (1 − 1/4)·i/3): f_0, ¾·f_1, ½·f_2, ¼·f_3.
	y := &moe.Yarn{Factor: 4, OriginalMaxPositions: 64, BetaFast: 32, BetaSlow: 1, Truncate: true, AttentionFactor: 1}
	check("truncated", invFreq(y, 8, 100), map[int]float64{0: 1, 1: 0.75 * plain(8, 100, 1), 2: 0.5 * plain(8, 100, 2), 3: 0.25 * plain(8, 100, 3)})
	// Without truncation hi = 2.0160002112515443 (the same dim(1), not
	// ceiled): ramp_1 = 1/hi, ramp_2 = 2/hi, ramp_3 = 1 (clamped).
	y.Truncate = false
	hi := 2.0160002112515443
	check("untruncated", invFreq(y, 8, 100), map[int]float64{0: 1,
		1: plain(8, 100, 1) * (1 - 0.75/hi), 2: plain(8, 100, 2) * (1 - 0.75*2/hi), 3: 0.25 * plain(8, 100, 3)})
	// DeepSeek-V3 (r = 64, θ = 10⁴, original 4096, factor 40, β 32 and 1):
	// dim(32) = 10.47 → lo = 10, dim(1) = 22.51 → hi = 23: pairs up to 10
	// keep their frequency, pairs from 23 on are divided by 40, pair 16 is
	// 6/13 of the way.
	ds := &moe.Yarn{Factor: 40, OriginalMaxPositions: 4096, BetaFast: 32, BetaSlow: 1, Truncate: true, AttentionFactor: 1}
	p := func(i int) float64 { return plain(64, 1e4, i) }
	check("deepseek-v3", invFreq(ds, 64, 1e4), map[int]float64{0: 1, 10: p(10), 16: p(16) * (1 - (39.0/40)*6/13), 23: p(23) / 40, 31: p(31) / 40})
	// No YaRN: the plain frequencies.
	var none *moe.Yarn
	check("plain", invFreq(none, 8, 100), map[int]float64{0: 1, 1: plain(8, 100, 1), 3: plain(8, 100, 3)})
}

// TestRopeTableYarnFactor: cos and sin carry YaRN's attention factor, so a
// rotation and its inverse multiply a vector by the factor squared.
func TestRopeTableYarnFactor(t *testing.T) {
	c := &moe.Config{HeadDim: 4, RotaryFraction: 1, RopeTheta: 100, RopeScaling: "yarn",
		Yarn: &moe.Yarn{Factor: 4, OriginalMaxPositions: 64, BetaFast: 32, BetaSlow: 1, Truncate: true, AttentionFactor: 1.5}}
	tab := Table[float64](c, 3)
	x := []float64{1, 2, 3, 4, 0.5, -1, 2, 0.25, -3, 1, 1, 2}
	want := append([]float64(nil), x...)
	tab.Apply(x, 1, 4, 3, false)
	tab.Apply(x, 1, 4, 3, true)
	for i := range x {
		if math.Abs(x[i]-2.25*want[i]) > 1e-12 {
			t.Fatalf("element %d: %v after rotation and inverse, want 1.5² × %v", i, x[i], want[i])
		}
	}
}

// FuzzYarnInvFreq: for any YaRN parameters Validate accepts, every inverse
// frequency is a blend of the plain one and the plain one ÷ factor: finite,
// positive and between the two.
func FuzzYarnInvFreq(f *testing.F) {
	f.Add(4.0, 64, 32.0, 1.0, true, 100.0, 8)
	f.Add(40.0, 4096, 32.0, 1.0, true, 1e4, 64)
	f.Add(0.5, 1, 1.0, 1.0, false, 2.0, 2)
	f.Fuzz(func(t *testing.T, factor float64, orig int, fast, slow float64, truncate bool, theta float64, r int) {
		if r < 2 || r > 256 || r%2 != 0 {
			return
		}
		// A tiny config Validate accepts, with the fuzzed RoPE fields.
		c := &moe.Config{Name: "t", ModelType: "llama", Vocab: 8, Hidden: 4, Layers: 1, Heads: 1, KVHeads: 1, HeadDim: 4,
			DenseFFN: 4, MoELayer: []bool{false}, Window: []int{0}, QKNorm: moe.QKNormNone, RotaryFraction: 1, NormEps: 1e-6, InitRange: 0.02,
			RopeScaling: "yarn", RopeTheta: theta,
			Yarn: &moe.Yarn{Factor: factor, OriginalMaxPositions: orig, BetaFast: fast, BetaSlow: slow, Truncate: truncate, AttentionFactor: 1}}
		if c.Validate() != nil {
			return
		}
		for i, v := range invFreq(c.Yarn, r, theta) {
			p := math.Pow(theta, -float64(2*i)/float64(r))
			lo, hi := math.Min(p, p/factor), math.Max(p, p/factor)
			if math.IsNaN(v) || math.IsInf(v, 0) || v < lo*(1-1e-12) || v > hi*(1+1e-12) {
				t.Fatalf("inv_freq[%d] = %v outside [%v, %v] (%+v, θ %v, r %d)", i, v, lo, hi, *c.Yarn, theta, r)
			}
		}
	})
}
