package moe

import "fmt"

// What a block keeps from forward for backward under its checkpointing
// policy, and the records of it (saved.go lists the same analytically).

// checkpointed reports whether this block recomputes its routed experts
// in backward (the block whole, selectively, or its MoE layer).
func (b *Block[T]) checkpointed() bool {
	return b.ac.Mode == ACSelective || b.ac.FullyCheckpointed(b.layer) || b.ac.MoERecomputed(b.cfg, b.layer)
}

// Cache keys for the selective policy's non-linear saved outputs.
const (
	opLSE     = Op(string(OpAttn) + "." + string(SavedLSE))
	opTopKIdx = Op(string(OpRouterTopK) + "." + string(SavedIndices))
)

// keep drops what the policy does not keep and records what it keeps.
func (b *Block[T]) keep() {
	st := &b.st
	switch {
	case b.ac.FullyCheckpointed(b.layer):
		*st = blockState[T]{x: st.x}
	case b.ac.Mode == ACSelective:
		cache := map[Op][]T{}
		for _, op := range SelectiveSaved(b.cfg, b.layer) {
			switch op {
			case OpQProj:
				cache[op] = st.qRaw
			case OpKProj:
				cache[op] = st.kRaw
			case OpVProj:
				cache[op] = st.v
			case OpOProj:
				cache[op] = st.ao
			case OpQAProj:
				cache[op] = st.mla.qa
			case OpQBProj:
				cache[op] = st.qRaw
			case OpKVAProj:
				cache[op] = st.mla.ckv
			case OpKVBProj:
				cache[op] = st.mla.kvb
			case OpSharedGate, OpDenseGate:
				cache[op] = st.ffn.g
			case OpSharedUp, OpDenseUp:
				cache[op] = st.ffn.u
			case OpSharedDown, OpDenseDown:
				cache[op] = st.fOut
			case OpSharedExpGate:
				cache[op] = st.gl
			default:
				panic(fmt.Sprintf("moe: selective cache has no slot for %s", op))
			}
		}
		cache[OpAttn], cache[opLSE] = st.o, st.lse
		if st.rt != nil {
			idx := make([]T, len(st.rt.Indices))
			for i, e := range st.rt.Indices {
				idx[i] = T(e)
			}
			cache[OpRouterTopK], cache[opTopKIdx] = st.topValTK, idx
		}
		*st = blockState[T]{x: st.x, cache: cache}
	default:
		// none: drop what no backward formula reads
		st.ao, st.topValTK = nil, nil // the routing keeps the values when it renormalizes
		if b.cfg.QKNorm == QKNormNone {
			st.qRaw, st.kRaw = nil, nil
		}
		st.mla.ckv, st.mla.kvb = nil, nil
		if !b.cfg.SharedGated {
			st.fOut = nil
		}
		st.gl = nil
		// modules: also the recomputed norms' outputs and rstd
		// (Backward's recomputeNorm rebuilds them from the kept inputs).
		if b.ac.NormRecomputed(b.cfg, b.layer, OpAttnNorm) {
			st.h1, st.rstd1 = nil, nil
		}
		if b.ac.NormRecomputed(b.cfg, b.layer, OpFFNNorm) {
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
	rec := func(op Op, name Saved, v []T, dt DType) {
		if v != nil {
			b.x.saved(L, op, name, len(v), dt)
		}
	}
	rec(OpAttnNorm, SavedInput, st.x, act)
	if st.cache != nil {
		for _, op := range SelectiveSaved(b.cfg, L) {
			rec(op, SavedOutput, st.cache[op], act)
		}
		rec(OpAttn, SavedOutput, st.cache[OpAttn], act)
		rec(OpAttn, SavedLSE, st.cache[opLSE], F32)
		rec(OpRouterTopK, SavedValues, st.cache[OpRouterTopK], F32)
		rec(OpRouterTopK, SavedIndices, st.cache[opTopKIdx], I64)
		return
	}
	if !st.complete {
		return
	}
	rec(OpAttnNorm, SavedRstd, st.rstd1, F32)
	if b.cfg.IsMLA() {
		b.mlaRecord(rec)
	} else {
		rec(OpQProj, SavedInput, st.h1, act)
	}
	if b.cfg.QKNorm != QKNormNone {
		rec(OpQNorm, SavedInput, st.qRaw, act)
		rec(OpQNorm, SavedRstd, st.qRstd, F32)
		rec(OpKNorm, SavedInput, st.kRaw, act)
		rec(OpKNorm, SavedRstd, st.kRstd, F32)
	}
	rec(OpAttn, SavedQ, st.q, act)
	rec(OpAttn, SavedK, st.k, act)
	rec(OpAttn, SavedV, st.v, act)
	rec(OpAttn, SavedOutput, st.o, act)
	rec(OpAttn, SavedLSE, st.lse, F32)
	rec(OpFFNNorm, SavedInput, st.x2, act)
	rec(OpFFNNorm, SavedRstd, st.rstd2, F32)
	if b.cfg.MoELayer[L] {
		rec(OpRouter, SavedInput, st.h2, act)
	} else {
		rec(OpDenseGate, SavedInput, st.h2, act)
	}
	ops := [4]Op{OpDenseAct, OpDenseAct, OpDenseAct, OpDenseDown}
	if rt := st.rt; b.cfg.MoELayer[L] && rt != nil {
		rec(OpRouterTopK, SavedScores, rt.Scores, F32)
		b.x.saved(L, OpRouterTopK, SavedIndices, len(rt.Indices), I64)
		rec(OpRouterTopK, SavedValues, rt.Values, F32)
		rec(OpRouterTopK, SavedDenominator, rt.Denom, F32)
		b.x.saved(L, OpDispatch, SavedOrder, len(rt.Order), I64)
		rec(OpCombine, SavedExpertOutput, st.expertOutTKD, act)
		rec(OpCombine, SavedWeights, rt.Weights, F32)
		ops = [4]Op{OpSharedAct, OpSharedAct, OpSharedAct, OpSharedDown}
	}
	if st.ffn.g != nil {
		rec(ops[0], SavedGate, st.ffn.g, act)
		rec(ops[1], SavedSiLUGate, st.ffn.sg, act)
		rec(ops[2], SavedUp, st.ffn.u, act)
		rec(ops[3], SavedInput, st.ffn.a, act)
	}
	if b.cfg.MoELayer[L] && b.cfg.SharedGated {
		rec(OpSharedScale, SavedGate, st.sGate, act)
		rec(OpSharedScale, SavedSharedOutput, st.fOut, act)
	}
}
