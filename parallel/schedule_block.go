package parallel

import "github.com/moescope/moescope/moe"

// a2a emits an all-to-all on the EP group after op dep (and, for a dispatch,
// after the ops in also, none of them -1); rows is the rows this rank sends
// under uniform routing (T·K), width the row width.
func (b *schedBuilder) a2a(micro, layer int, p Purpose, dep int, also ...int) int {
	if b.l.EP == 1 {
		return dep
	}
	// Under tp with etp = 1 each tp rank sends its 1/tp of the gathered
	// micro-batch's rows (Layout.TokensPerExpertRank).
	T := int64(b.sp.LBS) * int64(b.sp.Seq)
	rows := T * int64(b.cfg.TopK) / int64(b.l.TokensPerExpertRank())
	if p == PurposeDispatch {
		deps := []int{dep}
		for _, a := range also {
			if a >= 0 {
				deps = append(deps, a)
			}
		}
		dep = b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: micro, Layer: layer, Deps: deps,
			Coll: CollAllToAll, Axis: AxisEP, Purpose: PurposeCounts, DType: moe.I64, Elements: int64(b.cfg.Experts)})
	}
	el := rows * int64(b.cfg.Hidden)
	b.chain = b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: micro, Layer: layer, Deps: []int{dep},
		Coll: CollAllToAll, Axis: AxisEP, Purpose: p, DType: b.prec.Activation, Elements: el})
	return b.chain
}

// forwardBlock emits a block's forward (or recompute) segments and returns
// the last compute op id.
func (b *schedBuilder) forwardBlock(micro, layer int, ph Phase) int {
	dense := Unit{Layer: layer}
	g := b.gatherDep(dense, micro)
	b.unitFrom = b.chain
	if !b.cfg.MoELayer[layer] {
		return b.compute(micro, layer, ph, SegBlock, g)
	}
	ex := Unit{Layer: layer, Experts: true}
	var pre, ge int
	if b.megatron() {
		// The layer's pre-forward waits for all its buckets
		// (_pre_forward_param_unshard, wait_bucket_ready).
		ge = b.gatherDep(ex, micro)
		pre = b.compute(micro, layer, ph, SegPre, g, ge)
	} else {
		pre = b.compute(micro, layer, ph, SegPre, g)
		// FSDP2's pre-forward hook on the experts is prepended
		// (_fsdp_state.py), so their copy-out precedes torchtitan's
		// dispatch input hook (expert_parallel.py _token_dispatch):
		// the dispatch waits for their all-gather.
		b.unitFrom = pre
		ge = b.gatherDep(ex, micro)
	}
	d := b.a2a(micro, layer, PurposeDispatch, pre, ge)
	e := b.compute(micro, layer, ph, SegExperts, d, ge)
	c := b.a2a(micro, layer, PurposeCombine, e)
	post := b.compute(micro, layer, ph, SegPost, c)
	return post
}

// backwardBlock emits block l's backward: its recompute first when the
// block is fully checkpointed (its MoE layer's when the modules policy
// recomputes moe, moeRecompute), then its segments in reverse with the
// all-to-alls' gradients between them. done(u, id) runs as each of the
// block's units has its gradients (id: the op that completes them), where
// the step reduces them.
//
// With explicit prefetching the block's pre-backward first prefetches the
// block before it: before the recompute under FSDP2 (its hook is on the
// block's outputs), after it under Megatron (a reentrant checkpoint runs
// its forward without autograd, so the layer's pre-backward hook sits on
// the recomputed outputs). Megatron's post-backward hook is the layer's:
// the experts' gradients are handed over with the dense ones, after the
// layer's whole backward, and its pre-backward waits for all its buckets.
func (b *schedBuilder) backwardBlock(micro, l int, done func(u Unit, id int)) {
	dense, ex := Unit{Layer: l}, Unit{Layer: l, Experts: true}
	full := b.sp.AC.FullyCheckpointed(l)
	late := full && b.megatron()
	if b.explicitPrefetch() && !late {
		b.prefetch(true, b.blockUnits(l-1, true)...)
	}
	if full {
		b.forwardBlock(micro, l, PhaseRecompute)
	}
	if b.explicitPrefetch() && late {
		b.prefetch(true, b.blockUnits(l-1, true)...)
	}
	gd := b.gather(dense, micro)
	if !b.cfg.MoELayer[l] {
		done(dense, b.compute(micro, l, PhaseBackward, SegBlock, gd))
		return
	}
	ge := -1
	if b.megatron() {
		ge = b.gather(ex, micro)
	}
	if b.sp.AC.MoERecomputed(b.cfg, l) {
		gd = b.moeRecompute(micro, l, gd)
	}
	post := b.compute(micro, l, PhaseBackward, SegPost, gd, ge)
	if !b.megatron() {
		ge = b.gather(ex, micro)
	}
	c := b.a2a(micro, l, PurposeCombineBwd, post)
	e := b.compute(micro, l, PhaseBackward, SegExperts, c, ge)
	if !b.megatron() {
		done(ex, e)
	}
	d := b.a2a(micro, l, PurposeDispatchBwd, e)
	p := b.compute(micro, l, PhaseBackward, SegPre, d)
	if b.megatron() {
		done(ex, p)
	}
	done(dense, p)
}

// moeRecompute emits, before a MoE block's backward, the forward of its
// MoE layer again under the modules policy's moe (Megatron's
// CheckpointFunction over MoELayer.forward): the router and permutation
// (SegPre), the dispatch all-to-alls, the experts, the combine all-to-all
// and the combine and shared experts (SegPost), as PhaseRecompute ops after
// dep (the dense unit's gather). It returns the last op id, on which the
// backward waits.
func (b *schedBuilder) moeRecompute(micro, layer, dep int) int {
	pre := b.compute(micro, layer, PhaseRecompute, SegPre, dep)
	ge := b.gatherDep(Unit{Layer: layer, Experts: true}, micro)
	d := b.a2a(micro, layer, PurposeDispatch, pre)
	e := b.compute(micro, layer, PhaseRecompute, SegExperts, d, ge)
	c := b.a2a(micro, layer, PurposeCombine, e)
	return b.compute(micro, layer, PhaseRecompute, SegPost, c)
}
