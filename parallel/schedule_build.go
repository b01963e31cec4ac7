package parallel

import (
	"errors"
	"fmt"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// ScheduleSpec is what a schedule is built from.
type ScheduleSpec struct {
	Config    *moe.Config
	Mesh      *Mesh
	AC        moe.AC
	LBS       int // sequences per rank per micro-step
	Seq       int // tokens per sequence
	Micro     int // gradient-accumulation micro-steps (≥ 1)
	Precision moe.Precision
	// Memory are the memory package's options besides AC and Precision
	// (attention kind, loss chunks, optimizer implementation, allocator).
	Memory memory.Options
	// NoMemory leaves the memory timeline out (Setup, every op's Mem and
	// Peak stay empty): a caller that estimates the step's memory under
	// its own options (the virtual-time backend) would otherwise pay for
	// a second memory.Estimate it never reads.
	NoMemory bool
}

// BuildSchedule builds one rank's program of one training step (every rank
// runs the same program on its own groups).
//
// Per micro-step: forward over units embed, blocks 0…L−1, head; backward in
// reverse. FSDP all-gathers a unit's weights (compute dtype) on the comm
// stream before its first compute, prefetching one unit ahead (the gather of
// unit i waits for the compute of unit i−2, so at most two gathered units
// are live), and frees them after forward when reshard-after-forward is on
// (never the last block nor the head, which torchtitan keeps, as the memory
// package's timeline does), after backward unless
// keep-gathered holds them for the next micro-step's forward. Gradients of a
// unit are reduced right after its backward: reduce-scatter over the shard
// axis (fsdp, zero2) or all-reduce (zero1, ddp), then all-reduce over
// replicas (every micro-step, or only the last under allreduce-last-only);
// under grad-sync-last-only neither runs before the last micro-step, which
// reduces the accumulated gradients. Gradients are reduced in the memory
// options' reduce type (FSDP2's reduce_dtype; the gradient type when unset).
// MoE blocks with ep > 1 exchange per-expert counts and then tokens by
// all-to-all before and after the experts, and in reverse in backward; a
// fully checkpointed block re-runs its forward (all-to-alls included) before
// its backward, and under the modules policy's moe a MoE block its MoE
// layer's forward (moeRecompute). After the last micro-step: loss (and selection-bias load)
// all-reduces over dp, the optimizer, and under zero1/zero2 the all-gather of
// updated parameter shards. Under tensor parallelism every compute segment
// is preceded and followed by the collectives TPCollectives places there, on
// the tp group, in the computation's chain (with async TP only the first of
// tp chunks in it, the rest beside it), and each unit's gradient reduction
// starts with the all-reduce over tp of its replicated tensors' gradients
// (TPReplicatedElements); FSDP moves each tp rank's pieces
// (UnitTensors) and the all-to-alls each tp rank's rows. Collectives on
// one-member groups are omitted.
func BuildSchedule(sp ScheduleSpec) (*Schedule, error) {
	cfg, m := sp.Config, sp.Mesh
	if cfg == nil || m == nil {
		return nil, errors.New("schedule: config and mesh are required")
	}
	if sp.LBS < 1 || sp.Seq < 1 || sp.Micro < 1 {
		return nil, fmt.Errorf("schedule: lbs = %d, seq = %d, micro = %d: each must be ≥ 1", sp.LBS, sp.Seq, sp.Micro)
	}
	if err := m.Layout.CheckModel(cfg); err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	b := &schedBuilder{sp: sp, cfg: cfg, paramIx: NewUnitIndex(cfg), m: m, l: m.Layout, s: &Schedule{Layout: m.Layout, AC: sp.AC, LBS: sp.LBS, Seq: sp.Seq, Micro: sp.Micro}}
	b.prec = sp.Precision
	if b.prec == (moe.Precision{}) {
		b.prec = moe.DefaultPrecision
	}
	b.build()
	if sp.NoMemory {
		return b.s, nil
	}
	mo := sp.Memory
	mo.AC, mo.Precision = sp.AC, b.prec
	rep, err := memory.Estimate(cfg, m.Layout, memory.Batch{LBS: sp.LBS, Seq: sp.Seq, GradAccum: sp.Micro}, mo)
	if err != nil {
		return nil, fmt.Errorf("schedule: memory timeline: %w", err)
	}
	b.s.Peak = rep.Peak
	b.attachMemory(rep.Events)
	return b.s, nil
}

// attachMemory hands the memory package's timeline of the step to the ops:
// setup events to Schedule.Setup, and each run of events of one (phase,
// micro-step, unit layer) to the first compute op of that phase,
// micro-step and layer at or after the op that took the previous run
// (recompute ops count as backward, as the memory timeline places
// checkpoint recomputation there); a run of communication buffers only (the
// prefetch of the next unit's all-gather, the free of the previous unit's
// reduce-scatter buffer) stays with the op that took the previous run. The order is never changed, so Setup
// followed by every op's Mem in op order is the timeline itself, and
// memory.Replay of it gives the peak Schedule.Peak records.
func (b *schedBuilder) attachMemory(evs []memory.Event) {
	ops := b.s.Ops
	phaseOf := func(o ScheduleOp) memory.Phase {
		switch o.Phase {
		case PhaseForward:
			return memory.Forward
		case PhaseOptimizer:
			return memory.Optimizer
		}
		return memory.Backward
	}
	at := 0
	for i := 0; i < len(evs); {
		e := evs[i]
		j := i
		for j < len(evs) && evs[j].Phase == e.Phase && evs[j].Micro == e.Micro && evs[j].Layer == e.Layer {
			j++
		}
		if e.Phase == memory.Setup {
			b.s.Setup = append(b.s.Setup, evs[i:j]...)
			i = j
			continue
		}
		comm := true // communication buffers (a prefetch, a previous unit's reduce-scatter) stay with the current op
		for _, x := range evs[i:j] {
			comm = comm && x.Category == memory.CatComm
		}
		for k := at; k < len(ops) && !comm; k++ {
			o := ops[k]
			if o.Type == OpCompute && phaseOf(o) == e.Phase && (o.Phase == PhaseOptimizer || o.Micro == e.Micro && o.Layer == e.Layer) {
				at = k
				break
			}
		}
		ops[at].Mem = append(ops[at].Mem, evs[i:j]...)
		i = j
	}
}

type schedBuilder struct {
	sp      ScheduleSpec
	cfg     *moe.Config
	paramIx *UnitIndex
	m       *Mesh
	l       job.Layout
	prec    moe.Precision
	s       *Schedule

	gathered map[Unit]bool // unit weights currently unsharded
	// prefetched holds, for each unit an explicit prefetch has asked for
	// and whose all-gather is not yet emitted, the ops it waits for.
	prefetched map[Unit][]int
	gatherOp   map[Unit]int // id of the gather that made them so, or -1
	lastRS     []int        // grad collectives of the current micro-step
	// Gradient reductions in flight (rsIssued), oldest first, and the
	// ones the next compute op waits for (rsWait).
	rsQueue []rsEntry
	rsWait  []int
	// rsCap is Megatron's reduce queue capacity, in elements.
	rsCap    int64
	computes []int // compute op ids in issue order, for prefetch deps
	// unitFrom is the op before the first compute of the unit begun last
	// in the computation's chain: FSDP2 copies that unit's all-gather out
	// there, and its next all-gathers wait for that copy-out.
	unitFrom int

	// Tensor parallelism: each layer's collectives (TPCollectives) and,
	// under async TP, the overlapped parts of collectives the next compute
	// (tpDue) and the one after it (tpLater) wait for.
	tp             map[int][]TPColl
	tpDue, tpLater []int
	chain          int // the last op of the computation's chain (segment, all-to-all or tp collective), -1 before the first

	// pass builds one pipeline stage's pass (StagePass): no FSDP
	// collectives, which the pipeline program issues per stage.
	pass bool
}

func (b *schedBuilder) add(o ScheduleOp) int {
	o.ID = len(b.s.Ops)
	b.s.Ops = append(b.s.Ops, o)
	return o.ID
}

// units lists the FSDP units in forward order.
func (b *schedBuilder) units() []Unit {
	us := []Unit{{Layer: moe.LayerEmbed}}
	for l := 0; l < b.cfg.Layers; l++ {
		us = append(us, Unit{Layer: l})
		if b.cfg.MoELayer[l] {
			us = append(us, Unit{Layer: l, Experts: true})
		}
	}
	return append(us, Unit{Layer: b.cfg.LayerHead()})
}

// shardAxis is the axis a unit is sharded (and its gradients reduced) over.
func (b *schedBuilder) shardAxis(u Unit) Axis {
	if u.Experts {
		return AxisEFSDP
	}
	return AxisShard
}

func (b *schedBuilder) axisSize(a Axis) int {
	switch a {
	case AxisShard:
		return b.l.DPShard
	case AxisEFSDP:
		return b.l.ExpertShard()
	case AxisEP:
		return b.l.EP
	case AxisReplicate:
		return b.l.DPReplicate
	}
	return b.l.GPUs
}

func (b *schedBuilder) sizes(u Unit) (full, padded, shard int64) {
	a := b.shardAxis(u)
	return unitSizes(UnitTensors(b.cfg, b.paramIx, b.m, u, b.axisSize(a)))
}

func (b *schedBuilder) fsdp() bool { return b.l.Sharding == job.ShardFSDP }

// megatron says whether fsdp sharding follows Megatron's FSDP.
func (b *schedBuilder) megatron() bool { return b.fsdp() && b.l.FSDPImpl == job.FSDPMegatron }

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
		Coll: CollAllGather, Axis: b.shardAxis(u), Purpose: PurposeGather, Unit: u, DType: b.prec.Compute, Elements: padded})
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

// compute emits a compute segment after deps, with the tensor-parallel
// collectives TPCollectives places before and after it, and returns the
// id of the last op emitted (the segment, or its last collective after).
func (b *schedBuilder) compute(micro, layer int, ph Phase, seg Segment, deps ...int) int {
	var ds []int
	for _, d := range deps {
		if d >= 0 {
			ds = append(ds, d)
		}
	}
	var before []int
	if len(b.tp) > 0 {
		// The collectives before the segment follow the computation that
		// produced their input (the previous segment, all-to-all or
		// collective of the chain) and precede the segment.
		prev := b.chain
		for _, c := range b.tpAt(layer, ph, seg, false) {
			var dep []int
			if prev >= 0 {
				dep = []int{prev}
			}
			prev, before = b.tpColl(micro, layer, c, dep, before)
			ds = append(ds, prev)
		}
		if ph == PhaseOptimizer {
			ds = append(ds, b.tpLater...)
			b.tpLater = nil
		}
		ds = append(ds, b.tpDue...)
		b.tpDue = append(b.tpLater, before...)
		b.tpLater = nil
	}
	ds = append(ds, b.rsWait...)
	b.rsWait = nil
	o := ScheduleOp{Type: OpCompute, Stream: StreamCompute, Micro: micro, Layer: layer, Phase: ph, Segment: seg, Deps: ds}
	id := b.add(o)
	b.computes = append(b.computes, id)
	last := id
	for _, c := range b.tpAt(layer, ph, seg, true) {
		last, b.tpLater = b.tpColl(micro, layer, c, []int{last}, b.tpLater)
	}
	b.chain = last
	return last
}

// tpAt returns the tensor-parallel collectives of layer placed before
// (after = false) or after the compute of (ph, seg).
func (b *schedBuilder) tpAt(layer int, ph Phase, seg Segment, after bool) []TPColl {
	var out []TPColl
	for _, c := range b.tp[layer] {
		if c.Phase == ph && c.Segment == seg && c.After == after {
			out = append(out, c)
		}
	}
	return out
}

// tpColl emits one tensor-parallel collective after deps on the tp group
// and returns the op the computation waits for, with overlapped appended
// the id of its overlapped part, if any. Under async TP an all-gather or
// reduce-scatter is decomposed as torch's micro-pipeline TP does (the
// collective split into tp chunks, each overlapped with the matmul on the
// previous one): the first chunk, S/tp, is exposed; the other (tp−1)/tp·S
// are an AsyncPart op beside the compute, which the computation waits for
// one segment later.
func (b *schedBuilder) tpColl(micro, layer int, c TPColl, deps []int, overlapped []int) (int, []int) {
	o := ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: micro, Layer: layer, Deps: deps,
		Coll: c.Coll, Axis: AxisTP, Purpose: c.Purpose, DType: c.DType, Elements: c.Elements}
	if !b.l.AsyncTP || c.Coll == CollAllReduce {
		return b.add(o), overlapped
	}
	tp := int64(b.l.TPDegree())
	first := c.Elements / tp
	o.Elements = first
	id := b.add(o)
	o.Elements, o.AsyncPart, o.Deps = c.Elements-first, true, []int{id}
	return id, append(overlapped, b.add(o))
}

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

// reduceType is the type gradients are reduced in.
func (b *schedBuilder) reduceType() moe.DType {
	if t := b.sp.Memory.ReduceDType; t != "" {
		return t
	}
	return b.prec.Grad
}

// reduce emits the gradient collectives of u after op dep; none before the
// last micro-step under grad-sync-last-only (the memory timeline
// accumulates the unsharded gradients there instead). Under tensor
// parallelism the all-reduce over tp of u's replicated tensors' gradients
// comes first (TPReplicatedElements).
func (b *schedBuilder) reduce(u Unit, micro, dep int) {
	if b.l.GradSyncLastOnly && micro < b.sp.Micro-1 {
		return
	}
	orig := dep
	if b.l.TPDegree() > 1 {
		if n := TPReplicatedElements(b.paramIx, u); n > 0 {
			dt := b.prec.Compute
			if b.l.GradSyncLastOnly && b.sp.Micro > 1 {
				dt = b.reduceType()
			}
			dep = b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: micro, Layer: u.Layer, Deps: []int{dep},
				Coll: CollAllReduce, Axis: AxisTP, Purpose: PurposeTPGradSync, Unit: u, DType: dt, Elements: n})
		}
	}
	a := b.shardAxis(u)
	n := b.axisSize(a)
	full, padded, shard := b.sizes(u)
	last := dep
	switch b.l.Sharding {
	case job.ShardFSDP, job.ShardZeRO2:
		if n > 1 {
			last = b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: micro, Layer: u.Layer, Deps: []int{dep},
				Coll: CollReduceScatter, Axis: a, Purpose: PurposeGradReduce, Unit: u, DType: b.reduceType(), Elements: padded})
		}
	default:
		shard = full
		if n > 1 {
			last = b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: micro, Layer: u.Layer, Deps: []int{dep},
				Coll: CollAllReduce, Axis: a, Purpose: PurposeGradReduce, Unit: u, DType: b.reduceType(), Elements: full})
		}
	}
	if last != orig {
		b.lastRS = append(b.lastRS, last)
		b.rsIssued(last, padded)
	}
	if b.l.DPReplicate > 1 && (!b.l.AllreduceLastOnly || micro == b.sp.Micro-1) {
		id := b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: micro, Layer: u.Layer, Deps: []int{last},
			Coll: CollAllReduce, Axis: AxisReplicate, Purpose: PurposeGradReplica, Unit: u, DType: b.reduceType(), Elements: shard})
		b.lastRS = append(b.lastRS, id)
	}
}

// rsEntry is a gradient reduction in flight and its bucket's elements.
type rsEntry struct {
	id       int
	elements int64
}

// rsIssued records a shard-axis gradient reduction of elements and makes
// the next compute op wait for the reductions the implementation no longer
// lets run. FSDP2 keeps one in flight: a unit's post-backward waits for the
// previous unit's reduce-scatter event before its own (pytorch 010ae4a8
// _fsdp_param_group.py post_backward, comm_ctx.reduce_scatter_state).
// Megatron, before each bucket's reduction, waits for the oldest while the
// queued buckets hold more than twice the mean layer's elements
// (GradReducePipeline.wait_for_previous_grad_reduce with
// suggested_communication_unit_size): with equal layers, a layer's
// reduction waits for the experts of the layer two before it.
func (b *schedBuilder) rsIssued(id int, elements int64) {
	if b.megatron() {
		var queued int64
		for _, e := range b.rsQueue {
			queued += e.elements
		}
		for len(b.rsQueue) > 0 && queued > b.rsCap {
			b.rsWait = append(b.rsWait, b.rsQueue[0].id)
			queued -= b.rsQueue[0].elements
			b.rsQueue = b.rsQueue[1:]
		}
	} else {
		b.rsDrain()
	}
	b.rsQueue = append(b.rsQueue, rsEntry{id, elements})
}

// rsDrain makes the next compute op wait for every reduction in flight:
// FSDP2's root post-backward final callback, Megatron's
// GradReducePipeline.reset (wait_for_previous_grad_reduce(0)).
func (b *schedBuilder) rsDrain() {
	for _, e := range b.rsQueue {
		b.rsWait = append(b.rsWait, e.id)
	}
	b.rsQueue = nil
}

// megatronQueueCap is Megatron's default suggested_communication_unit_size
// under optim_grads_params: twice the mean parameter count of its FSDP
// units, the transformer layers (fully_sharded_data_parallel.py; the
// embedding and output layer are not units).
func (b *schedBuilder) megatronQueueCap() int64 {
	var total int64
	for l := 0; l < b.cfg.Layers; l++ {
		for _, u := range b.blockUnits(l, true) {
			full, _, _ := b.sizes(u)
			total += full
		}
	}
	return total / int64(b.cfg.Layers) * 2
}

// reset readies b for a program (build, StagePass): no unit gathered,
// no chain yet, no reduce-scatter in flight.
func (b *schedBuilder) reset() {
	b.gathered = map[Unit]bool{}
	b.gatherOp = map[Unit]int{}
	b.prefetched = map[Unit][]int{}
	b.chain, b.unitFrom = -1, -1
	b.rsQueue, b.rsWait = nil, nil
}

func (b *schedBuilder) build() {
	b.reset()
	if b.l.TPDegree() > 1 {
		b.tp = map[int][]TPColl{}
		T := b.sp.LBS * b.sp.Seq
		for l := moe.LayerEmbed; l <= b.cfg.LayerHead(); l++ {
			b.tp[l] = TPCollectives(b.cfg, b.l, l, T, b.sp.AC, b.prec.Activation)
		}
	}
	head := b.cfg.LayerHead()
	ra := b.l.ReshardAfterForward
	keep := b.l.KeepGathered
	explicit := b.explicitPrefetch()
	mg := b.megatron()
	if mg {
		b.rsCap = b.megatronQueueCap()
	}
	emb, hu := Unit{Layer: moe.LayerEmbed}, Unit{Layer: head}
	// Megatron's embedding and output layer are not FSDP units: gathered
	// by their first forward, they stay so for the step, and their
	// gradients are reduced at the end of each backward
	// (_root_post_backward).
	freeEnds := func(lastMicro bool) bool { return !mg && (!keep || lastMicro) }
	for micro := 0; micro < b.sp.Micro; micro++ {
		lastMicro := micro == b.sp.Micro-1
		done := func(u Unit, id int) {
			b.reduce(u, micro, id)
			if !keep || lastMicro {
				b.free(u)
			}
		}
		// Forward.
		g := b.gather(emb, micro)
		b.unitFrom = b.chain
		if explicit {
			b.prefetch(false, b.blockUnits(0, false)...)
		}
		id := b.compute(micro, moe.LayerEmbed, PhaseForward, SegEmbed, g)
		if ra && !b.cfg.TiedEmbeddings && !mg { // tied: the head reads the embedding's weights
			b.free(emb)
		}
		for l := 0; l < b.cfg.Layers; l++ {
			if explicit {
				b.prefetch(false, b.blockUnits(l+1, true)...)
			}
			id = b.forwardBlock(micro, l, PhaseForward)
			// The schedule keeps the last block gathered into the
			// backward, as the memory package's timeline does; Megatron
			// frees every layer after its forward (_post_forward
			// release_module_parameters).
			if ra && (l != b.cfg.Layers-1 || mg) {
				b.free(Unit{Layer: l})
				if b.cfg.MoELayer[l] {
					b.free(Unit{Layer: l, Experts: true})
				}
			}
		}
		g = b.gather(hu, micro)
		b.compute(micro, head, PhaseForward, SegHead, g)
		// Backward. torchtitan's output layer prefetches the last block
		// (set_modules_to_backward_prefetch); Megatron's is no unit and
		// has no pre-backward hook.
		b.lastRS = nil
		if explicit && !mg {
			b.prefetch(true, b.blockUnits(b.cfg.Layers-1, false)...)
		}
		hid := b.compute(micro, head, PhaseBackward, SegHead)
		if !mg {
			b.reduce(hu, micro, hid)
		}
		if freeEnds(lastMicro) {
			b.free(hu)
		}
		for l := b.cfg.Layers - 1; l >= 0; l-- {
			b.backwardBlock(micro, l, done)
		}
		g = b.gather(emb, micro)
		id = b.compute(micro, moe.LayerEmbed, PhaseBackward, SegEmbed, g)
		if mg {
			b.reduce(hu, micro, id)
		}
		b.reduce(emb, micro, id)
		if freeEnds(lastMicro) {
			b.free(emb)
		}
		// The root's post-backward final callback: the compute stream
		// waits for the backward's reductions (FSDPState
		// _root_post_backward_final_callback), so the next micro-step's
		// forward starts after them.
		b.rsDrain()
	}
	// Step end.
	deps := append([]int(nil), b.lastRS...)
	if b.l.GPUs > 1 {
		// Each rank's per-micro-batch cross-entropy and aux loss as float64
		// bit patterns (two f32 words each), gathered so that every rank can
		// average them in one rank's order.
		deps = append(deps, b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: -1, Layer: head,
			Coll: CollAllGather, Axis: AxisDP, Purpose: PurposeLoss, DType: moe.F32, Elements: int64(4 * b.sp.Micro * b.l.GPUs)}))
		if b.cfg.SelectionBias && b.cfg.IsMoE() {
			deps = append(deps, b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: -1, Layer: head,
				Coll: CollAllReduce, Axis: AxisDP, Purpose: PurposeBiasLoad, DType: moe.F32, Elements: int64(b.cfg.Experts * b.cfg.MoELayers())}))
		}
	}
	opt := b.compute(-1, moe.LayerEmbed, PhaseOptimizer, SegUpdate, deps...)
	if b.l.Sharding == job.ShardZeRO1 || b.l.Sharding == job.ShardZeRO2 {
		for _, u := range b.units() {
			a := b.shardAxis(u)
			if n := b.axisSize(a); n > 1 {
				_, padded, _ := b.sizes(u)
				b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: -1, Layer: u.Layer, Deps: []int{opt},
					Coll: CollAllGather, Axis: a, Purpose: PurposeRegather, Unit: u, DType: b.prec.Param, Elements: padded})
			}
		}
	}
}

// StagePass is one pipeline micro-batch's forward (backward false) or
// backward through stage s of p as BuildSchedule emits the same layers for
// one micro-step of pp_microbatch_size sequences on the stage's layout:
// the compute segments, the expert-parallel all-to-alls and the
// tensor-parallel collectives (StageTPCollectives' list, in its order),
// with the same dependencies. Under async TP each all-gather and
// reduce-scatter is its exposed first chunk and its overlapped part
// (tpColl), the computation waiting for the overlapped part one segment
// later; the last collectives' overlapped parts have no segment after them
// in the pass, which ends when they do (the stage's output, or its input's
// gradient, is what they produce). A backward holds each fully
// checkpointed block's recompute before its backward. Left out: the FSDP
// collectives and the replicated gradients' all-reduce, which the pipeline
// program issues once per stage and micro-step (BuildPipeline). Op ids are
// the pass's own, from 0.
func (p *Pipeline) StagePass(cfg *moe.Config, s, seq int, ac moe.AC, prec moe.Precision, backward bool) ([]ScheduleOp, error) {
	if cfg == nil {
		return nil, errors.New("stage pass: config is required")
	}
	if s < 0 || s >= len(p.Split) {
		return nil, fmt.Errorf("stage pass: stage %d: must be in [0, %d)", s, len(p.Split))
	}
	if seq < 1 {
		return nil, fmt.Errorf("stage pass: seq = %d: must be ≥ 1", seq)
	}
	if prec == (moe.Precision{}) {
		prec = moe.DefaultPrecision
	}
	l := p.Stage.Layout
	mbs := p.Layout.PPMicrobatchSize
	b := &schedBuilder{sp: ScheduleSpec{Config: cfg, Mesh: p.Stage, AC: ac, LBS: mbs, Seq: seq, Micro: 1, Precision: prec, NoMemory: true},
		cfg: cfg, paramIx: NewUnitIndex(cfg), m: p.Stage, l: l, prec: prec, s: &Schedule{Layout: l, AC: ac, LBS: mbs, Seq: seq, Micro: 1},
		pass: true}
	b.reset()
	first, count := p.StageLayers(s)
	last := s == len(p.Split)-1
	if l.TPDegree() > 1 {
		b.tp = map[int][]TPColl{}
		for _, layer := range p.stageLayerIDs(cfg, s) {
			b.tp[layer] = TPCollectives(cfg, l, layer, mbs*seq, ac, prec.Activation)
		}
	}
	if !backward {
		if s == 0 {
			b.compute(0, moe.LayerEmbed, PhaseForward, SegEmbed)
		}
		for layer := first; layer < first+count; layer++ {
			b.forwardBlock(0, layer, PhaseForward)
		}
		if last {
			b.compute(0, cfg.LayerHead(), PhaseForward, SegHead)
		}
		return b.s.Ops, nil
	}
	if last {
		b.compute(0, cfg.LayerHead(), PhaseBackward, SegHead)
	}
	for layer := first + count - 1; layer >= first; layer-- {
		b.backwardBlock(0, layer, func(Unit, int) {})
	}
	if s == 0 {
		b.compute(0, moe.LayerEmbed, PhaseBackward, SegEmbed)
	}
	return b.s.Ops, nil
}
