package ref

import "math"

// Cross-entropy over the vocabulary, averaged over the T predicted
// positions of a micro-batch (HF's ForCausalLMLoss with no ignored labels):
//
//	log p_t = z_t − logsumexp(z_t),  loss = −(1/T)·Σ_t log p_t[y_t]
//	∂loss/∂z_t = (softmax(z_t) − onehot(y_t))/T
//
// The log-probabilities are kept for backward (log_softmax keeps its
// output; nll_loss keeps the labels).

// crossEntropyFwd overwrites logits [T,V] with log-probabilities and returns
// the mean loss.
func crossEntropyFwd[T Float](logits []T, labels []int, V int) float64 {
	var loss float64
	for t, y := range labels {
		z := logits[t*V : t*V+V]
		mx := z[0]
		for _, v := range z {
			mx = max(mx, v)
		}
		var s float64
		for _, v := range z {
			s += math.Exp(float64(v - mx))
		}
		lse := T(float64(mx) + math.Log(s))
		for i := range z {
			z[i] -= lse
		}
		loss -= float64(z[y])
	}
	return loss / float64(len(labels))
}

// crossEntropyBwd writes dz [T,V] = scale·(exp(logp) − onehot)/T.
func crossEntropyBwd[T Float](dz, logp []T, labels []int, V int, scale float64) {
	c := T(scale / float64(len(labels)))
	for t, y := range labels {
		lp, d := logp[t*V:t*V+V], dz[t*V:t*V+V]
		for i, v := range lp {
			d[i] = c * exp(v)
		}
		d[y] -= c
	}
}
