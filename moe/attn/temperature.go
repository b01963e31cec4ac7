package attn

// Llama 4's attention temperature tuning on its NoPE layers
// (Llama4TextAttention.forward, transformers 000c33fd; moe.AttnTemperature
// gives the factor of position p, 1 + attn_scale·ln(1 + ⌊(p+1)/floor_scale⌋)):
// every query head of the token at position p is multiplied by f_p before
// attention. It is linear in q, so its backward multiplies dq by the same f_p.

// ScaleQueries multiplies x [T tokens, width] in place, token t (position
// t mod len(f) of its sequence) by f[t mod len(f)].
func ScaleQueries[T Float](x []T, width int, f []float64) {
	for t := 0; t < len(x)/width; t++ {
		s := T(f[t%len(f)])
		for i := range x[t*width : t*width+width] {
			x[t*width+i] *= s
		}
	}
}
