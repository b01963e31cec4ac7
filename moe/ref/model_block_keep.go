package ref

import (
	"fmt"
	"github.com/moescope/moescope/moe"
)

// What a block keeps from forward for backward under its checkpointing
// policy, and the records of it (moe/saved.go lists the same analytically).

// checkpointed reports whether this block recomputes its routed experts
// in backward (the block whole, selectively, or its MoE layer).
func (b *Block[T]) checkpointed() bool {
	return b.ac.Caches() || b.ac.FullyCheckpointed(b.layer) || b.ac.MoERecomputed(b.cfg, b.layer)
}

// Cache keys for the selective policy's non-linear saved outputs.
const (
	opLSE     = moe.Op(string(moe.OpAttn) + "." + string(moe.SavedLSE))
	opTopKIdx = moe.Op(string(moe.OpRouterTopK) + "." + string(moe.SavedIndices))
)

// keep drops what the policy does not keep and records what it keeps.
func (b *Block[T]) keep() {
	st := &b.st
	switch {
	case b.ac.FullyCheckpointed(b.layer):
		*st = blockState[T]{x: st.x}
	case b.ac.Caches():
		kept, _ := b.ac.Cached(b.cfg, b.layer, b.seq, b.x.act)
		cache := map[moe.Op][]T{}
		for _, op := range kept.Linears {
			switch op {
			case moe.OpQProj:
				cache[op] = st.qRaw
			case moe.OpKProj:
				cache[op] = st.kRaw
			case moe.OpVProj:
				cache[op] = st.v
			case moe.OpOProj:
				cache[op] = st.ao
			case moe.OpQAProj:
				cache[op] = st.mla.qa
			case moe.OpQBProj:
				cache[op] = st.qRaw
			case moe.OpKVAProj:
				cache[op] = st.mla.ckv
			case moe.OpKVBProj:
				cache[op] = st.mla.kvb
			case moe.OpSharedGate, moe.OpDenseGate:
				cache[op] = st.ffn.g
			case moe.OpSharedUp, moe.OpDenseUp:
				cache[op] = st.ffn.u
			case moe.OpSharedDown, moe.OpDenseDown:
				cache[op] = st.fOut
			case moe.OpSharedExpGate:
				cache[op] = st.gl
			default:
				panic(fmt.Sprintf("moe: selective cache has no slot for %s", op))
			}
		}
		if kept.Attn {
			cache[moe.OpAttn], cache[opLSE] = st.o, st.lse
		}
		if kept.TopK && st.rt != nil {
			idx := make([]T, len(st.rt.Indices))
			for i, e := range st.rt.Indices {
				idx[i] = T(e)
			}
			cache[moe.OpRouterTopK], cache[opTopKIdx] = st.topValTK, idx
		}
		*st = blockState[T]{x: st.x, cache: cache}
	default:
		// none: drop what no backward formula reads
		st.ao, st.topValTK = nil, nil // the routing keeps the values when it renormalizes
		if b.cfg.QKNorm == moe.QKNormNone || b.cfg.QKNorm == moe.QKNormL2Rope {
			st.qRaw, st.kRaw = nil, nil // l2_rope's norm reads qPre, kPre
		}
		st.mla.ckv, st.mla.kvb = nil, nil
		if !b.cfg.SharedGated {
			st.fOut = nil
		}
		st.gl = nil
		// modules: also the recomputed norms' outputs and rstd
		// (Backward's recomputeNorm rebuilds them from the kept inputs).
		if b.ac.NormRecomputed(b.cfg, b.layer, moe.OpAttnNorm) {
			st.h1, st.rstd1 = nil, nil
		}
		if b.ac.NormRecomputed(b.cfg, b.layer, moe.OpFFNNorm) {
			st.h2, st.rstd2 = nil, nil
		}
		// moe: nothing of the MoE layer but its input h2 (Backward's
		// moeRecompute runs the layer again).
		if b.ac.MoERecomputed(b.cfg, b.layer) {
			st.rt, st.expertOutTKD, st.ffn, st.fOut, st.sGate = nil, nil, ffnActs[T]{}, nil, nil
		}
	}
	b.recordKept()
}

// recordKept reports every tensor the block holds for backward.
func (b *Block[T]) recordKept() {
	if b.x.rec == nil {
		return
	}
	st, L, act := &b.st, b.layer, b.x.act
	rec := func(op moe.Op, name moe.Saved, v []T, dt moe.DType) {
		if v != nil {
			b.x.saved(L, op, name, len(v), dt)
		}
	}
	rec(moe.OpAttnNorm, moe.SavedInput, st.x, act)
	if st.cache != nil {
		kept, _ := b.ac.Cached(b.cfg, L, b.seq, act)
		for _, op := range kept.Linears {
			rec(op, moe.SavedOutput, st.cache[op], act)
		}
		rec(moe.OpAttn, moe.SavedOutput, st.cache[moe.OpAttn], act)
		rec(moe.OpAttn, moe.SavedLSE, st.cache[opLSE], moe.F32)
		rec(moe.OpRouterTopK, moe.SavedValues, st.cache[moe.OpRouterTopK], moe.F32)
		rec(moe.OpRouterTopK, moe.SavedIndices, st.cache[opTopKIdx], moe.I64)
		return
	}
	if !st.complete {
		return
	}
	rec(moe.OpAttnNorm, moe.SavedRstd, st.rstd1, moe.F32)
	if b.cfg.IsMLA() {
		b.mlaRecord(rec)
	} else {
		rec(moe.OpQProj, moe.SavedInput, st.h1, act)
	}
	if qIn, kIn := st.qRaw, st.kRaw; b.cfg.LayerQKNorm(L) {
		if b.cfg.QKNorm == moe.QKNormL2Rope {
			qIn, kIn = st.qPre, st.kPre
		}
		rec(moe.OpQNorm, moe.SavedInput, qIn, act)
		rec(moe.OpQNorm, moe.SavedRstd, st.qRstd, moe.F32)
		rec(moe.OpKNorm, moe.SavedInput, kIn, act)
		rec(moe.OpKNorm, moe.SavedRstd, st.kRstd, moe.F32)
	}
	rec(moe.OpAttn, moe.SavedQ, st.q, act)
	rec(moe.OpAttn, moe.SavedK, st.k, act)
	rec(moe.OpAttn, moe.SavedV, st.v, act)
	rec(moe.OpAttn, moe.SavedOutput, st.o, act)
	rec(moe.OpAttn, moe.SavedLSE, st.lse, moe.F32)
	rec(moe.OpFFNNorm, moe.SavedInput, st.x2, act)
	rec(moe.OpFFNNorm, moe.SavedRstd, st.rstd2, moe.F32)
	if b.cfg.MoELayer[L] {
		rec(moe.OpRouter, moe.SavedInput, st.h2, act)
	} else {
		rec(moe.OpDenseGate, moe.SavedInput, st.h2, act)
	}
	ops := [4]moe.Op{moe.OpDenseAct, moe.OpDenseAct, moe.OpDenseAct, moe.OpDenseDown}
	if rt := st.rt; b.cfg.MoELayer[L] && rt != nil {
		rec(moe.OpRouterTopK, moe.SavedScores, rt.Scores, moe.F32)
		b.x.saved(L, moe.OpRouterTopK, moe.SavedIndices, len(rt.Indices), moe.I64)
		rec(moe.OpRouterTopK, moe.SavedValues, rt.Values, moe.F32)
		rec(moe.OpRouterTopK, moe.SavedDenominator, rt.Denom, moe.F32)
		b.x.saved(L, moe.OpDispatch, moe.SavedOrder, len(rt.Order), moe.I64)
		rec(moe.OpCombine, moe.SavedExpertOutput, st.expertOutTKD, act)
		rec(moe.OpCombine, moe.SavedWeights, rt.Weights, moe.F32)
		ops = [4]moe.Op{moe.OpSharedAct, moe.OpSharedAct, moe.OpSharedAct, moe.OpSharedDown}
	}
	if st.ffn.g != nil {
		rec(ops[0], moe.SavedGate, st.ffn.g, act)
		rec(ops[1], moe.SavedSiLUGate, st.ffn.sg, act)
		rec(ops[2], moe.SavedUp, st.ffn.u, act)
		rec(ops[3], moe.SavedInput, st.ffn.a, act)
	}
	if b.cfg.MoELayer[L] && b.cfg.SharedGated {
		rec(moe.OpSharedScale, moe.SavedGate, st.sGate, act)
		rec(moe.OpSharedScale, moe.SavedSharedOutput, st.fOut, act)
	}
}
