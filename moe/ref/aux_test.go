package ref

import (
	"math"
	"math/rand/v2"
	"testing"
)

// hfAux transcribes transformers' load_balancing_loss_func step by step:
// concatenate the layers' scores [N,E], one-hot the selections [N,K,E],
// tokens_per_expert = mean over N → [K,E], router_prob_per_expert = mean
// over N → [E], loss = E·Σ tokens_per_expert·router_prob_per_expert.
func hfAux(E, K int, rts []*Routing[float64]) float64 {
	var scores [][]float64
	var sel [][]int32
	for _, rt := range rts {
		for t := 0; t < rt.Tokens; t++ {
			scores = append(scores, rt.Scores[t*E:t*E+E])
			sel = append(sel, rt.Indices[t*K:t*K+K])
		}
	}
	N := float64(len(scores))
	tpe := make([][]float64, K)
	for k := range tpe {
		tpe[k] = make([]float64, E)
	}
	ppe := make([]float64, E)
	for n := range scores {
		for k, e := range sel[n] {
			tpe[k][e] += 1 / N
		}
		for e, s := range scores[n] {
			ppe[e] += s / N
		}
	}
	var loss float64
	for k := range tpe {
		for e := range ppe {
			loss += tpe[k][e] * ppe[e]
		}
	}
	return loss * float64(E)
}

// deepseekAux transcribes MoEGate's seq_aux branch for one layer:
// ce = scatter_add of ones over [B, S·K] indices, divided by S·K/E;
// aux = mean_b Σ_e ce·mean_t(scores).
func deepseekAux(E, K, B, S int, rt *Routing[float64]) float64 {
	var aux float64
	for b := 0; b < B; b++ {
		ce := make([]float64, E)
		for t := b * S; t < (b+1)*S; t++ {
			for _, e := range rt.Indices[t*K : t*K+K] {
				ce[e]++
			}
		}
		for e := range ce {
			ce[e] /= float64(S*K) / float64(E)
			var mean float64
			for t := b * S; t < (b+1)*S; t++ {
				mean += rt.Scores[t*E+e]
			}
			aux += ce[e] * mean / float64(S)
		}
	}
	return aux / float64(B)
}

// TestAuxLossMatchesTranscription compares the aux loss ForwardBackward
// reports with the HF and DeepSeek formulas transcribed literally.
func TestAuxLossMatchesTranscription(t *testing.T) {
	for _, name := range []string{"qwen3_moe", "qwen2_moe", "deepseek"} {
		c := tinyVariants()[name]
		m := newTestModel(t, c, 11)
		const B, S = 3, 4
		tokens := randomTokens(rand.New(rand.NewPCG(5, 6)), c, B, S)
		res, err := m.ForwardBackward(tokens, 1, Options{AuxCoef: 0.5})
		if err != nil {
			t.Fatal(err)
		}
		// rerun the blocks by hand to get their routings
		w, _ := layerViews(c, m.Params, m.Tensors())
		x := make([]float64, B*S*c.Hidden)
		for i, s := range tokens {
			for j := 0; j < S; j++ {
				copy(x[(i*S+j)*c.Hidden:], w.global.Embed[s[j]*c.Hidden:(s[j]+1)*c.Hidden])
			}
		}
		var rts []*Routing[float64]
		var want float64
		for l := 0; l < c.Layers; l++ {
			b := NewBlock[float64](c, l, B, S, Options{})
			x = b.Forward(&w.layers[l], x)
			if rt := b.Routing(); rt != nil {
				rts = append(rts, rt)
				if name == "deepseek" {
					want += deepseekAux(c.Experts, c.TopK, B, S, rt)
				}
			}
		}
		if name != "deepseek" {
			want = hfAux(c.Experts, c.TopK, rts)
		}
		if math.Abs(res.Aux-want) > 1e-12*math.Abs(want) || want == 0 {
			t.Errorf("%s: aux %v, transcription %v", name, res.Aux, want)
		}
		if math.Abs(res.Total-(res.Loss+0.5*res.Aux)) > 1e-12 {
			t.Errorf("%s: total %v ≠ loss %v + 0.5·aux %v", name, res.Total, res.Loss, res.Aux)
		}
	}
}
