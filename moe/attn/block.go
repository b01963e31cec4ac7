package attn

import "math"

// Block attention: one context-parallel rank's queries against one block
// of keys and values (its own or another rank's shard), with the causal
// mask taken on the tokens' positions in the whole sequence: query at
// position p sees key at position p' iff p' ≤ p. For one sequence and head, with
// c the softmax scale and S_ij = c·q_i·k_j over the visible pairs,
//
//	lse_i^(b) = log Σ_{j∈b} exp(S_ij),  o_i^(b) = Σ_{j∈b} exp(S_ij − lse_i^(b))·v_j
//
// and blocks merge by their log-sum-exps (the online softmax of ring
// attention: Liu et al., "Ring Attention with Blockwise Transformers",
// 2023; TransformerEngine d0067d0da context_parallel.py
// AttnFuncWithCPAndKVP2P corrects out and softmax_lse the same way):
//
//	lse = log(exp(lse^a) + exp(lse^b)),  o = exp(lse^a − lse)·o^a + exp(lse^b − lse)·o^b
//
// Backward is FlashAttention-2's (Dao, 2023, Algorithm 2) block by block
// with the final lse and D_i = Σ_e dO_ie·O_ie: P_ij = exp(S_ij − lse_i),
// dV_j += P_ij·dO_i, dS_ij = P_ij·(dO_i·v_j − D_i), dQ_i += c·dS_ij·k_j,
// dK_j += c·dS_ij·q_i — exact per block because lse is the whole row's.
//
// Keys and values travel packed: kv [T, 2·G·d], row t = k_t then v_t.
// The shape's Batch, Heads, KV, D and Scale apply (D = DV; no window:
// the mask is the positions'); its Seq and tiles do not. Float32 only:
// the numeric ranks' element type.

// BlockForward writes o [T, H·d] and lse [T, H] of queries q (positions
// qpos) against the key block kv (positions kpos) alone; a row with no
// visible key gets lse = −Inf and o = 0. It returns the visible score
// entries per head, summed over the sequences.
func BlockForward(o, lse, q, kv []float32, qpos, kpos []int, a Shape) int64 {
	H, G, d := a.Heads, a.KV, a.D
	mq, mk, rep := len(qpos), len(kpos), H/G
	sc := make([]float64, mk)
	acc := make([]float64, d)
	var n int64
	for b := 0; b < a.Batch; b++ {
		for i, pi := range qpos {
			t := b*mq + i
			for h := 0; h < H; h++ {
				qi := q[(t*H+h)*d:][:d]
				off := (h / rep) * d
				mx := math.Inf(-1)
				for j, pj := range kpos {
					sc[j] = math.Inf(-1)
					if pj > pi {
						continue
					}
					kj := kv[(b*mk+j)*2*G*d+off:][:d]
					var dot float64
					for e, x := range qi {
						dot += float64(x) * float64(kj[e])
					}
					sc[j] = dot * a.Scale
					mx = max(mx, sc[j])
					n++
				}
				oi := o[(t*H+h)*d:][:d]
				if math.IsInf(mx, -1) {
					clear(oi)
					lse[t*H+h] = float32(math.Inf(-1))
					continue
				}
				clear(acc)
				var sum float64
				for j := range kpos {
					if math.IsInf(sc[j], -1) {
						continue
					}
					p := math.Exp(sc[j] - mx)
					sum += p
					vj := kv[(b*mk+j)*2*G*d+G*d+off:][:d]
					for e := range acc {
						acc[e] += p * float64(vj[e])
					}
				}
				for e := range oi {
					oi[e] = float32(acc[e] / sum)
				}
				lse[t*H+h] = float32(mx + math.Log(sum))
			}
		}
	}
	return n / int64(H) // every head sees the same pairs
}

// MergeBlock folds a block's (o2, lse2) into the running (o, lse).
func MergeBlock(o, lse, o2, lse2 []float32, d int) {
	for r, l2 := range lse2 {
		l1 := lse[r]
		if math.IsInf(float64(l2), -1) {
			continue
		}
		oi, o2i := o[r*d:][:d], o2[r*d:][:d]
		if math.IsInf(float64(l1), -1) {
			copy(oi, o2i)
			lse[r] = l2
			continue
		}
		m := math.Max(float64(l1), float64(l2))
		l := m + math.Log(math.Exp(float64(l1)-m)+math.Exp(float64(l2)-m))
		a, b := math.Exp(float64(l1)-l), math.Exp(float64(l2)-l)
		for e := range oi {
			oi[e] = float32(a*float64(oi[e]) + b*float64(o2i[e]))
		}
		lse[r] = float32(l)
	}
}

// BlockBackward accumulates into dq [T, H·d] and dkv (packed like kv) the
// gradients of the block kv (positions kpos) for queries q (positions
// qpos) with the output's gradient do, the final lse and delta [T, H] =
// Σ_e do·o. It returns the visible score entries per head, summed over
// the sequences.
func BlockBackward(dq, dkv, do, q, kv, lse, delta []float32, qpos, kpos []int, a Shape) int64 {
	H, G, d := a.Heads, a.KV, a.D
	mq, mk, rep := len(qpos), len(kpos), H/G
	c := a.Scale
	var n int64
	for b := 0; b < a.Batch; b++ {
		for i, pi := range qpos {
			t := b*mq + i
			for h := 0; h < H; h++ {
				qi, doi, dqi := q[(t*H+h)*d:][:d], do[(t*H+h)*d:][:d], dq[(t*H+h)*d:][:d]
				off := (h / rep) * d
				li, di := float64(lse[t*H+h]), float64(delta[t*H+h])
				for j, pj := range kpos {
					if pj > pi {
						continue
					}
					n++
					row := (b*mk + j) * 2 * G * d
					kj, vj := kv[row+off:][:d], kv[row+G*d+off:][:d]
					var dot, dp float64
					for e := range qi {
						dot += float64(qi[e]) * float64(kj[e])
						dp += float64(doi[e]) * float64(vj[e])
					}
					p := math.Exp(dot*c - li)
					ds := p * (dp - di) * c
					dkj, dvj := dkv[row+off:][:d], dkv[row+G*d+off:][:d]
					for e := range qi {
						dvj[e] += float32(p * float64(doi[e]))
						dqi[e] += float32(ds * float64(kj[e]))
						dkj[e] += float32(ds * float64(qi[e]))
					}
				}
			}
		}
	}
	return n / int64(H) // every head sees the same pairs
}

// OutputDelta is D [T, H] = Σ_e do·o per token and head.
func OutputDelta(do, o []float32, d int) []float32 {
	delta := make([]float32, len(o)/d)
	for r := range delta {
		var t float64
		for e := 0; e < d; e++ {
			t += float64(do[r*d+e]) * float64(o[r*d+e])
		}
		delta[r] = float32(t)
	}
	return delta
}
