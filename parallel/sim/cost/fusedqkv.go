package cost

import "github.com/moescope/moescope/moe"

// fusedQKVSeconds prices the attention's input projections when they run
// as one GEMM (torchtitan main's FusedQKVLinear, pytorch/torchtitan b5bcd76
// torchtitan/models/common/attention.py: one wqkv Linear of
// (n_heads + 2·n_kv_heads)·head_dim outputs, its output split after the
// GEMM): the q record carries the whole GEMM, of the concatenated width
// q + 2·kv over the same rows and input, in each pass (forward X·Wᵀ,
// backward-data dY·W, backward-weight dYᵀ·X); the k and v records cost
// nothing of their own, their FLOPs being inside it. The FLOPs are the
// three GEMMs' exactly; what changes is the wider GEMM's tile waste and
// the two launches fewer. ok is false for the ops it does not price.
func (c ComputeSpec) fusedQKVSeconds(cfg *moe.Config, rec moe.OpRecord, r rate) (t float64, ok bool) {
	switch rec.Op {
	case moe.OpKProj, moe.OpVProj:
		return 0, true
	case moe.OpQProj:
	default:
		return 0, false
	}
	q, in, _ := weightShape(cfg, moe.OpQProj)
	kv, _, _ := weightShape(cfg, moe.OpKProj)
	if q*in == 0 {
		return 0, false
	}
	rows := rec.Count / (q * in)
	out := q + 2*kv
	switch rec.Pass {
	case moe.BackwardData:
		return c.gemmSeconds(rows, in, out, r), true
	case moe.BackwardWeight:
		return c.gemmSeconds(out, in, rows, r), true
	}
	return c.gemmSeconds(rows, out, in, r), true
}
