package attn

// PackKV interleaves k and v [T, G·d] into rows [T, 2·G·d]: one message
// per token for a context-parallel rank's K/V exchange.
func PackKV(k, v []float32, w int) []float32 {
	T := len(k) / w
	kv := make([]float32, 2*len(k))
	for t := 0; t < T; t++ {
		copy(kv[2*t*w:], k[t*w:(t+1)*w])
		copy(kv[(2*t+1)*w:], v[t*w:(t+1)*w])
	}
	return kv
}

// UnpackAddKV adds the packed rows of dkv (PackKV's layout) into dk and
// dv [T, G·d].
func UnpackAddKV(dk, dv, dkv []float32, w int) {
	for t := 0; t < len(dk)/w; t++ {
		for e := 0; e < w; e++ {
			dk[t*w+e] += dkv[2*t*w+e]
			dv[t*w+e] += dkv[(2*t+1)*w+e]
		}
	}
}
