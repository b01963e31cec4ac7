package parallel

import (
	"errors"
	"fmt"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// ScheduleSpec is what a schedule is built from: the run (its model,
// batch, checkpointing and recipe, whose storage types the collectives
// move and the memory timeline holds; empty recipe fields are
// job.DefaultRecipe's) on a mesh, whose layout is the one the schedule
// runs (the run's own Layout is not read).
type ScheduleSpec struct {
	job.Spec
	Mesh *Mesh
	// NoMemory leaves the memory timeline out (Setup, every op's Mem and
	// Peak stay empty): a caller that estimates the step's memory under
	// its own options (the virtual-time backend) would otherwise pay for
	// a second memory.Estimate it never reads.
	NoMemory bool
}

// BuildSchedule builds one rank's program of one training step (every rank
// runs the same program on its own groups).
//
// The program walks the step's order (job.StepOrder, which the memory
// timeline and the numeric ranks walk too): per micro-step, forward over
// units embed, blocks 0…L−1, head; backward in reverse. FSDP all-gathers a
// unit's weights (compute dtype) on the comm stream before a compute that
// needs them, prefetching one unit ahead (the gather of unit i waits for
// the compute of unit i−2, so at most two gathered units are live), and
// frees them where the order says (after forward under
// reshard-after-forward, after backward but under keep-gathered). Gradients
// of a unit are reduced right after its backward: reduce-scatter over the shard
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
	cfg, m := sp.Model, sp.Mesh
	if cfg == nil || m == nil {
		return nil, errors.New("schedule: config and mesh are required")
	}
	if err := sp.Batch.Validate(); err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	if err := sp.Recipe.Resolve(); err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	if err := m.Layout.CheckModel(cfg); err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	b := &schedBuilder{sp: sp, cfg: cfg, paramIx: NewUnitIndex(cfg), m: m, l: m.Layout, s: &Schedule{Layout: m.Layout, AC: sp.AC, LBS: sp.LBS, Seq: sp.Seq, GradAccum: sp.GradAccum}}
	b.prec = sp.Storage()
	b.build()
	if sp.NoMemory {
		return b.s, nil
	}
	rep, err := memory.Estimate(cfg, m.Layout, memory.Batch{LBS: sp.LBS, Seq: sp.Seq, GradAccum: sp.GradAccum}, memory.OptionsOf(sp.Recipe, sp.AC))
	if err != nil {
		return nil, fmt.Errorf("schedule: memory timeline: %w", err)
	}
	b.s.Peak = rep.Peak
	b.attachMemory(rep.Events)
	return b.s, nil
}

// schedBuilder emits one rank's program of one step (BuildSchedule) or one
// pipeline stage's pass (StagePass, stagepass.go). The step's skeleton and
// the compute segments are here; beside it are the FSDP all-gathers and
// prefetching (schedule_gather.go), the gradient reductions
// (schedule_reduce.go), a block's segments with the MoE all-to-alls
// (schedule_block.go), the tensor-parallel collectives (schedule_tp.go)
// and the memory timeline's attachment to the ops (schedule_memory.go).
type schedBuilder struct {
	sp      ScheduleSpec
	cfg     *moe.Config
	paramIx *UnitIndex
	m       *Mesh
	l       job.Layout
	prec    moe.Precision
	s       *Schedule

	order    job.StepOrder // the step's order (build), which this program walks
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

// fp8Padded is the padded elements of unit u an fp8 all-gather gathers in
// fp8 (job.Recipe.GathersFP8In and GathersFP8): 0 without one, and for
// routed experts.
func (b *schedBuilder) fp8Padded(u Unit) int64 {
	if !b.sp.GathersFP8In(b.l) || u.Experts {
		return 0
	}
	var n int64
	ts := UnitTensors(b.cfg, b.paramIx, b.m, u, b.axisSize(b.shardAxis(u)))
	for i, ix := range b.paramIx.ByLayer[u.Layer] {
		if b.sp.GathersFP8(b.paramIx.params[ix]) {
			n += ts[i].PaddedElements()
		}
	}
	return n
}

func (b *schedBuilder) fsdp() bool { return b.l.Sharding == job.ShardFSDP }

// megatron says whether fsdp sharding follows Megatron's FSDP.
func (b *schedBuilder) megatron() bool { return b.fsdp() && b.l.FSDPImpl == job.FSDPMegatron }

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

// reset readies b for a program (build, StagePass): no unit gathered,
// no chain yet, no reduce-scatter in flight.
func (b *schedBuilder) reset() {
	b.gathered = map[Unit]bool{}
	b.gatherOp = map[Unit]int{}
	b.prefetched = map[Unit][]int{}
	b.chain, b.unitFrom = -1, -1
	b.rsQueue, b.rsWait = nil, nil
}

// build emits the step: per micro-step its forward and backward, then the
// step's end (BuildSchedule says what each holds). Each is a method of its
// own so that the step's order reads here at a glance.
func (b *schedBuilder) build() {
	b.reset()
	b.order = job.NewStepOrder(b.cfg, b.l, b.sp.GradAccum)
	if b.l.TPDegree() > 1 {
		b.tp = map[int][]TPColl{}
		T := b.sp.LBS * b.sp.Seq
		for l := moe.LayerEmbed; l <= b.cfg.LayerHead(); l++ {
			b.tp[l] = TPCollectives(b.cfg, b.l, l, T, b.sp.AC, b.prec.Activation)
		}
	}
	if b.megatron() {
		b.rsCap = b.megatronQueueCap()
	}
	for micro := 0; micro < b.sp.GradAccum; micro++ {
		b.forward(micro)
		b.backward(micro)
	}
	b.stepEnd()
}

// forward emits micro-step micro's forward (a step of build), walking the
// step's order (job.StepOrder): the embedding, the blocks with their
// prefetches, the head, each unit's weights freed where the order says.
func (b *schedBuilder) forward(micro int) {
	head := b.cfg.LayerHead()
	explicit := b.explicitPrefetch()
	for _, ph := range b.order.Forward(micro) {
		switch l := ph.Layer; l {
		case moe.LayerEmbed:
			g := b.gather(Unit{Layer: l}, micro)
			b.unitFrom = b.chain
			if explicit {
				b.prefetch(false, b.blockUnits(0, false)...)
			}
			b.compute(micro, l, PhaseForward, SegEmbed, g)
		case head:
			g := b.gather(Unit{Layer: l}, micro)
			b.compute(micro, l, PhaseForward, SegHead, g)
		default:
			if explicit {
				b.prefetch(false, b.blockUnits(l+1, true)...)
			}
			b.forwardBlock(micro, l, PhaseForward)
		}
		if ph.Free {
			b.freeLayer(ph.Layer)
		}
	}
}

// freeLayer releases the gathered weights of layer's units (a block's
// dense unit and its experts).
func (b *schedBuilder) freeLayer(layer int) {
	b.free(Unit{Layer: layer})
	if layer >= 0 && layer < b.cfg.Layers && b.cfg.MoELayer[layer] {
		b.free(Unit{Layer: layer, Experts: true})
	}
}

// backward emits micro-step micro's backward (a step of build), walking
// the step's order: the head, the blocks in reverse, the embedding, each
// unit's gradients reduced as they are complete and its weights freed
// where the order says, then the wait for the reductions. Megatron's
// embedding and output layer are not FSDP units: their gradients are
// reduced at the end of each backward (_root_post_backward).
func (b *schedBuilder) backward(micro int) {
	head := b.cfg.LayerHead()
	explicit := b.explicitPrefetch()
	mg := b.megatron()
	emb, hu := Unit{Layer: moe.LayerEmbed}, Unit{Layer: head}
	b.lastRS = nil
	for _, ph := range b.order.Backward(micro) {
		switch l := ph.Layer; l {
		case head:
			// torchtitan's output layer prefetches the last block
			// (set_modules_to_backward_prefetch); Megatron's is no
			// unit and has no pre-backward hook.
			if explicit && !mg {
				b.prefetch(true, b.blockUnits(b.cfg.Layers-1, false)...)
			}
			g := b.gather(hu, micro)
			hid := b.compute(micro, head, PhaseBackward, SegHead, g)
			if !mg {
				b.reduce(hu, ph, hid)
			}
		case moe.LayerEmbed:
			g := b.gather(emb, micro)
			id := b.compute(micro, moe.LayerEmbed, PhaseBackward, SegEmbed, g)
			if mg {
				b.reduce(hu, b.order.Phase(job.StepBackward, micro, head), id)
			}
			b.reduce(emb, ph, id)
		default:
			b.backwardBlock(micro, l, func(u Unit, id int) { b.reduce(u, ph, id) })
		}
		if ph.Free {
			b.freeLayer(ph.Layer)
		}
	}
	// The root's post-backward final callback: the compute stream
	// waits for the backward's reductions (FSDPState
	// _root_post_backward_final_callback), so the next micro-step's
	// forward starts after them.
	b.rsDrain()
}

// stepEnd emits what follows the last micro-step (a step of build): the
// loss and selection-bias collectives, the optimizer after them and the
// last micro-step's gradient reductions, and under zero1/zero2 the
// all-gather of the updated parameter shards.
func (b *schedBuilder) stepEnd() {
	head := b.cfg.LayerHead()
	deps := append([]int(nil), b.lastRS...)
	if b.l.GPUs > 1 {
		// Each rank's per-micro-batch cross-entropy and aux loss as float64
		// bit patterns (two f32 words each), gathered so that every rank can
		// average them in one rank's order.
		deps = append(deps, b.add(ScheduleOp{Type: OpCollective, Stream: StreamComm, Micro: -1, Layer: head,
			Coll: CollAllGather, Axis: AxisDP, Purpose: PurposeLoss, DType: moe.F32, Elements: int64(4 * b.sp.GradAccum * b.l.GPUs)}))
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
