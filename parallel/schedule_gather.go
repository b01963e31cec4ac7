package parallel

// explicitPrefetch says whether each block's all-gathers are issued one
// block ahead, at the previous block's pre-forward (in backward, the next
// block's pre-backward), rather than when its compute needs them:
// torchtitan v0.2.2 sets FSDP2's explicit prefetching when ep > 1
// (73a0e69 models/llama4/infra/parallelize.py apply_fsdp, "D2H syncs in EP
// could interfere with implicit prefetching"), and Megatron's FSDP always
// gathers the next unit with the current one (Megatron-LM 1e057005
// custom_fsdp AllGatherPipeline.all_gather_params, prefetching up to
// suggested_communication_unit_size, twice the mean unit).
func (b *schedBuilder) explicitPrefetch() bool {
	return b.fsdp() && !b.pass && (b.megatron() || b.l.EP > 1)
}

// blockUnits are the units of block l gathered together by an explicit
// prefetch: torchtitan's embedding and head prefetch a block without its
// experts (withExperts false); Megatron's unit is the whole layer.
func (b *schedBuilder) blockUnits(l int, withExperts bool) []Unit {
	us := []Unit{{Layer: l}}
	if (withExperts || b.megatron()) && l >= 0 && l < b.cfg.Layers && b.cfg.MoELayer[l] {
		us = append(us, Unit{Layer: l, Experts: true})
	}
	return us
}

// issuedNow is what a collective issued at this point waits for, besides
// its stream's order: the compute stream's work so far (the chain's last
// op and the reductions the next compute op is to wait for) when FSDP2's
// all-gather streams wait on a copy-out event recorded now, or c10d's
// NCCL stream on the current stream (Megatron); in FSDP2's forward, the
// copy-out of the unit begun last (wait_for_unshard's deferred
// all_gather_state event), unitFrom.
func (b *schedBuilder) issuedNow(backward bool) []int {
	dep := b.chain
	if !backward && !b.megatron() {
		dep = b.unitFrom
	}
	var deps []int
	if dep >= 0 {
		deps = append(deps, dep)
	}
	return append(deps, b.rsWait...)
}

// prefetch marks the units us, not yet gathered, as prefetched now: their
// all-gathers wait for issuedNow. They are still emitted where the unit's
// compute asks for them (gather): ops of a stream run in list order, and
// the all-gather stream's order is the same either way.
func (b *schedBuilder) prefetch(backward bool, us ...Unit) {
	for _, u := range us {
		if !b.gathered[u] {
			b.prefetched[u] = b.issuedNow(backward)
		}
	}
}

// gather emits the all-gather of u if needed and returns its id or -1. A
// prefetched unit's waits for its prefetch point; under Megatron any
// other's for the work before it (the unit's own hook issues it); under
// FSDP2 for the compute two ops back (at most two gathered units live
// under implicit prefetching).
func (b *schedBuilder) gather(u Unit, micro int) int {
	if b.pass || !b.fsdp() || b.gathered[u] {
		return -1
	}
	deps, ok := b.prefetched[u]
	delete(b.prefetched, u)
	switch {
	case ok:
	case b.megatron():
		deps = b.issuedNow(true)
	default:
		if k := len(b.computes); k >= 2 {
			deps = []int{b.computes[k-2]}
		}
	}
	b.gathered[u] = true
	n := b.axisSize(b.shardAxis(u))
	if n == 1 {
		b.gatherOp[u] = -1
		return -1
	}
	_, padded, _ := b.sizes(u)
	id := b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: micro, Layer: u.Layer, Deps: deps,
		Coll: CollAllGather, Axis: b.shardAxis(u), Purpose: PurposeGather, Unit: u, DType: b.prec.Compute, Elements: padded,
		FP8Elements: b.fp8Padded(u)})
	b.gatherOp[u] = id
	return id
}

// gatherDep gathers u if needed and returns the op the unit's compute
// must wait for (the gather that made it live), or -1.
func (b *schedBuilder) gatherDep(u Unit, micro int) int {
	if g := b.gather(u, micro); g >= 0 {
		return g
	}
	if g, ok := b.gatherOp[u]; ok && b.gathered[u] {
		return g
	}
	return -1
}

// free releases u's gathered weights after op id.
func (b *schedBuilder) free(u Unit) {
	if !b.fsdp() || !b.gathered[u] {
		return
	}
	b.gathered[u] = false
}
