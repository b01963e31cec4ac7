package sim

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// Virtual time under pipeline parallelism (pp > 1). parallel.BuildPipeline
// gives one program per pipeline rank; walkPipeline runs them against
// modelled durations:
//   - a rank runs its ops in order; a forward or backward takes its
//     stage's modelled time for one micro-batch (the stage's compute ops
//     priced as a step without pipelining prices them, at the micro-batch's
//     shape, with the expert-parallel all-to-alls, which run inline on the
//     compute stream as torchtitan runs them);
//   - under zero-bubble schedules a backward-input pass takes the
//     backward-data ops (the dX GEMMs and grouped dX, attention and
//     elementwise backward, recompute, the all-to-alls' gradients) and a
//     backward-weight pass the backward-weight ops (dW GEMMs, grouped dW,
//     the norms' and embedding's weight gradients), the two summing to the
//     full backward; the input gradient is sent when the input pass ends.
//     On the first stage the input pass is empty and the weight pass runs
//     the whole backward, as PyTorch's stage does (moe/pipeline.go);
//   - neighbouring stages on one rank (a V's bottom) exchange no message;
//   - a send is asynchronous: the message arrives a transfer time after the
//     sender's compute ends (one link between the two ranks: NVLink inside
//     a domain, the NIC otherwise; concurrent messages and collectives do
//     not share bandwidth in this model); a receive waits for its message;
//   - a stage's FSDP all-gathers run on the rank's communication stream
//     when the rank reaches them; the stage's first forward starts once the
//     first of them is done and ends no earlier than the last (FSDP2
//     prefetches each next unit during the current unit's compute);
//   - gradient reductions run on the communication stream after the
//     stage's last backward of each micro-step, beside later compute;
//   - under tensor parallelism a stage's forward and backward include its
//     layers' tp collectives (parallel.Pipeline.StageTPCollectives), which
//     block the computation as in a step without pipelining, priced on
//     the widest tp group of any stage; the all-reduce of the replicated
//     tensors' gradients over tp runs on the compute stream before the
//     unit's reduce-scatter (FSDP2 redistributes the gradient on the
//     default stream), and the messages are a tp rank's sequence shard;
//   - under async TP a stage's forward and backward are instead walked on
//     the engine as Simulate walks a step (asyncPasses): the stage's pass
//     (parallel.Pipeline.StagePass) exposes the first of tp chunks of each
//     all-gather and reduce-scatter and runs the rest beside the compute,
//     which waits for it one segment later; the pass ends when its last
//     op does;
//   - after its last op and its communication, each rank runs its
//     optimizer step over its own shard. The step ends with the last rank.
//
// The bubble is what the walk leaves idle: no formula is applied. One
// data-parallel rank per stage is simulated; the stage's other ranks run
// the same program on groups of the same shape (exact under balanced
// routing; with skew the stage takes its most loaded rank's expert GEMMs,
// as Simulate's note says).

// pipeCosts are the durations walkPipeline walks with.
type pipeCosts struct {
	fwd, bwd []float64 // per stage, one micro-batch, seconds
	rec      []float64 // per stage: the recompute inside bwd
	wgt      []float64 // per stage: the backward-weight ops inside bwd
	msg      func(from, to int) float64
	coll     func(o parallel.ScheduleOp) float64
	opt      []float64 // per pp rank: optimizer step

	// tpFwd and tpBwd are the tensor-parallel collectives inside fwd and
	// bwd, per stage and collective kind (tpKinds).
	tpFwd, tpBwd []tpSeconds
	// inp and tpInp, set under async TP with a zero-bubble schedule, are
	// the backward-input pass walked on its own (asyncPasses), per stage;
	// nil: the input pass is bwd − wgt and holds tpBwd.
	inp   []float64
	tpInp []tpSeconds
}

// tpSeconds are tensor-parallel collectives' seconds by kind (tpKinds):
// those the computation waits for (exposed), and how long they ran
// (overlapped or not; equal to exposed but under async TP).
type tpSeconds struct{ exposed, ran [len(tpKinds)]float64 }

// add adds t seconds of a collective of kind k that the computation waits
// for in full.
func (x *tpSeconds) add(k int, t float64) {
	x.exposed[k] += t
	x.ran[k] += t
}

// compute is the duration of compute op o and the recompute inside it.
func (c pipeCosts) compute(o parallel.PipeOp) (d, rec float64) {
	s := o.Stage
	switch {
	case o.Kind == parallel.PipeForward:
		return c.fwd[s], 0
	case o.Kind == parallel.PipeBackward, s == 0 && o.Kind == parallel.PipeWeight:
		return c.bwd[s], c.rec[s]
	case s == 0: // the first stage's input pass does nothing
		return 0, 0
	case o.Kind == parallel.PipeInput && c.inp != nil:
		return c.inp[s], c.rec[s]
	case o.Kind == parallel.PipeInput:
		return c.bwd[s] - c.wgt[s], c.rec[s]
	}
	return c.wgt[s], 0
}

// tpIn is the tensor-parallel collectives' seconds inside op o by kind
// (tpKinds), nil for none: a forward's, and a backward's wherever its
// backward-data runs (a full backward, an input pass, stage 0's weight
// pass, as compute prices them).
func (c pipeCosts) tpIn(o parallel.PipeOp) *tpSeconds {
	if c.tpFwd == nil {
		return nil
	}
	s := o.Stage
	switch {
	case o.Kind == parallel.PipeForward:
		return &c.tpFwd[s]
	case s > 0 && o.Kind == parallel.PipeInput && c.tpInp != nil:
		return &c.tpInp[s]
	case o.Kind == parallel.PipeBackward, s == 0 && o.Kind == parallel.PipeWeight, s > 0 && o.Kind == parallel.PipeInput:
		return &c.tpBwd[s]
	}
	return nil
}

// pipeSpan is one op as the walk ran it.
type pipeSpan struct {
	op         parallel.PipeOp
	start, end float64
	comm       bool // on the communication stream (collectives) or a message in flight (send)
}

// tpKinds are the kinds of tensor-parallel collectives, in the order
// pipeCosts and pipeRank keep their seconds.
var tpKinds = [...]parallel.CollKind{parallel.CollAllGather, parallel.CollReduceScatter, parallel.CollAllReduce}

func tpKind(k parallel.CollKind) int {
	for i, x := range tpKinds {
		if x == k {
			return i
		}
	}
	return len(tpKinds) - 1
}

// pipeRank is one pipeline rank's walk.
type pipeRank struct {
	spans     []pipeSpan
	busy      float64 // forward + backward seconds
	recompute float64 // inside busy
	// tp is the tensor-parallel collectives' seconds on the compute stream
	// by kind (tpKinds): inside busy but for the gradient all-reduces,
	// which run between backwards; tpRan how long they ran (more under
	// async TP, whose overlapped parts run beside the compute).
	tp, tpRan [len(tpKinds)]float64
	tpOutside float64 // the part of tp outside busy
	gatherOn  float64 // seconds compute waited for FSDP gathers
	computeAt float64 // when its last compute op ended
	commAt    float64 // when its communication stream went idle
	optS      float64
	end       float64 // after the optimizer
}

// pipeWalk is the walked step.
type pipeWalk struct {
	ranks []pipeRank
	step  float64
}

type pipeMsg struct {
	from, to, micro int
	grad            bool
}

// walkPipeline runs p's programs against c (see above).
func walkPipeline(p *parallel.Pipeline, c pipeCosts) (pipeWalk, error) {
	n := len(p.Ranks)
	w := pipeWalk{ranks: make([]pipeRank, n)}
	arrive := map[pipeMsg]float64{}
	next := make([]int, n)
	clock := make([]float64, n) // compute stream
	comm := make([]float64, n)  // communication stream
	// gathers: the gathers issued for the stage about to run its first
	// forward: the first one's end and the last one's.
	type pending struct{ first, last float64 }
	gathers := make([]pending, n)
	for left := 0; ; {
		left = 0
		progress := false
		for r := range n {
			ops := p.Ranks[r]
		run:
			for next[r] < len(ops) {
				o := ops[next[r]]
				wr := &w.ranks[r]
				switch o.Kind {
				case parallel.PipeRecv:
					t, ok := arrive[pipeMsg{o.Peer, o.Stage, o.Micro, o.Grad}]
					if !ok {
						break run
					}
					clock[r] = math.Max(clock[r], t)
				case parallel.PipeSend:
					d := c.msg(o.Stage, o.Peer)
					arrive[pipeMsg{o.Stage, o.Peer, o.Micro, o.Grad}] = clock[r] + d
					wr.spans = append(wr.spans, pipeSpan{op: o, start: clock[r], end: clock[r] + d, comm: true})
				case parallel.PipeColl:
					if o.Coll.Axis == parallel.AxisTP {
						d := c.coll(o.Coll)
						wr.spans = append(wr.spans, pipeSpan{op: o, start: clock[r], end: clock[r] + d, comm: true})
						clock[r] += d
						wr.tp[tpKind(o.Coll.Coll)] += d
						wr.tpRan[tpKind(o.Coll.Coll)] += d
						wr.tpOutside += d
						break
					}
					start := math.Max(comm[r], clock[r])
					comm[r] = start + c.coll(o.Coll)
					if o.Coll.Purpose == parallel.PurposeGather {
						if gathers[r].first == 0 {
							gathers[r].first = comm[r]
						}
						gathers[r].last = comm[r]
					}
					wr.spans = append(wr.spans, pipeSpan{op: o, start: start, end: comm[r], comm: true})
				case parallel.PipeForward, parallel.PipeBackward, parallel.PipeInput, parallel.PipeWeight:
					d, rec := c.compute(o)
					wr.recompute += rec
					if tp := c.tpIn(o); tp != nil {
						for k := range tpKinds {
							wr.tp[k] += tp.exposed[k]
							wr.tpRan[k] += tp.ran[k]
						}
					}
					start, end := clock[r], clock[r]+d
					if g := gathers[r]; g.last > 0 {
						start = math.Max(start, g.first)
						end = math.Max(start+d, g.last)
						wr.gatherOn += (end - start) - d
						gathers[r] = pending{}
					}
					wr.busy += d
					wr.spans = append(wr.spans, pipeSpan{op: o, start: start, end: end})
					clock[r] = end
				}
				next[r]++
				progress = true
			}
			left += len(ops) - next[r]
		}
		if left == 0 {
			break
		}
		if !progress {
			return pipeWalk{}, fmt.Errorf("sim: pipeline deadlock with %d ops left (next ops %v)", left, next)
		}
	}
	for r := range n {
		wr := &w.ranks[r]
		wr.computeAt, wr.commAt = clock[r], comm[r]
		wr.optS = c.opt[r]
		wr.end = math.Max(clock[r], comm[r]) + c.opt[r]
		w.step = math.Max(w.step, wr.end)
	}
	return w, nil
}

// StageTiming is one pipeline rank's share of the simulated step.
type StageTiming struct {
	Rank   int   `json:"rank"`
	Stages []int `json:"stages"`
	Layers int   `json:"layers"`
	// BusyS is forward and backward compute; IdleFraction = 1 − (busy +
	// optimizer) ÷ step: the bubble, waits on messages and exposed FSDP
	// communication.
	BusyS        float64 `json:"busy_s"`
	OptimizerS   float64 `json:"optimizer_s"`
	EndS         float64 `json:"end_s"`
	IdleFraction float64 `json:"idle_fraction"`
}

// PipelineTiming is the pipeline's part of a Result.
type PipelineTiming struct {
	Schedule         moe.PPSchedule `json:"schedule"`
	Microbatches     int            `json:"microbatches"` // per accumulation micro-step
	VirtualStages    int            `json:"virtual_stages"`
	MessageBytes     int64          `json:"message_bytes"`
	Stages           []StageTiming  `json:"stages"`
	P2PLink          []string       `json:"p2p_link"` // link class of each stage boundary s → s+1 ("same rank": none)
	SimulatedPerRank string         `json:"simulated"`
}

// simulatePipeline is Simulate for pp > 1.
func simulatePipeline(in Input) (Result, error) {
	if in.GradAccum == 0 {
		in.GradAccum = 1
	}
	su, err := setupPipeline(in)
	if err != nil {
		return Result{}, err
	}
	cfg, l, pl, dev, cl, exact := in.Config, in.Layout, su.pl, su.dev, su.cl, su.exact
	mem, err := memory.Estimate(cfg, l, memory.Batch{LBS: in.LBS, Seq: in.Seq, GradAccum: in.GradAccum}, su.mo)
	if err != nil {
		return Result{}, fmt.Errorf("simulate: memory: %w", err)
	}
	convs, hwFLOP, err := flopsPerToken(cfg, in)
	if err != nil {
		return Result{}, err
	}
	pc, tpLink, err := pipelinePrices(pl, cfg, cl, in, su.inMB, su.spec, su.costs, su.loads, su.mo)
	if err != nil {
		return Result{}, err
	}
	walk, err := walkPipeline(pl, pc)
	if err != nil {
		return Result{}, err
	}
	res := Result{Device: dev.Name, Cluster: cl.Name, StepTimeS: walk.step, DeviceBytes: dev.MemoryBytes}
	if !(res.StepTimeS > 0) {
		return Result{}, errors.New("simulate: zero step time")
	}
	// torchtitan's TPS divides the tokens by pp and tp as well as by the
	// data-parallel ranks: a GPU's share of its replica's tokens.
	tokens := float64(in.LBS) * float64(in.Seq) * float64(in.GradAccum) / float64(l.Stages()*l.TPDegree())
	res.TPS = tokens / res.StepTimeS
	res.MFUByConvention = map[string]float64{}
	for name, f := range convs {
		res.MFUByConvention[name] = f * res.TPS / dev.BF16FLOPs
	}
	res.MFU = res.MFUByConvention[string(flops.Torchtitan)]
	res.HFU = hwFLOP * res.TPS / dev.BF16FLOPs
	peak := mem.Peak
	if cal := in.Calibration; cal != nil && cal.AllocatorOverhead > 0 {
		peak.Reserved = peak.ReservedWith(cal.AllocatorOverhead)
	}
	res.PeakAllocatedBytes, res.PeakReservedBytes = peak.Allocated, peak.Reserved
	res.MemoryFraction = float64(peak.Reserved) / float64(dev.MemoryBytes)
	target := in.MemoryTarget
	if target == 0 {
		target = memory.DefaultMemoryTarget
	}
	res.Fit = memory.Judge(peak.Reserved, dev.Outside(l.EP), dev.MemoryBytes, target)
	res.Pipeline = pipelineTiming(pl, walk, cl, in)
	res.Breakdown, res.Bottleneck = pipelineBreakdown(walk)
	res.Exactness = "pipeline: one data-parallel rank per stage simulated, standing for its stage (" + exact + ")"
	if l.TPDegree() > 1 {
		res.TPLink = tpLink.String()
		g := tpShape(cl, pl)
		async := ""
		if l.AsyncTP {
			async = "; async TP: each stage's forward and backward walked on the step engine, the overlapped parts beside the compute"
		}
		res.Exactness = fmt.Sprintf("pipeline: one rank per stage simulated, standing for its stage's data-parallel and tp ranks; the tp collectives priced on the widest tp group of any stage (%d ranks in %d NVLink domain(s))%s (%s)",
			g.Ranks, g.Domains, async, exact)
	}
	if in.KeepTimeline {
		res.pipe = &walk
	}
	return res, nil
}

// pipelineSetup is what a pipeline's prices are computed from: the
// program, the hardware, in at one micro-batch on the stage layout (inMB),
// the compute spec, the stage's segment costs at that shape and the expert
// loads.
type pipelineSetup struct {
	pl    *parallel.Pipeline
	dev   hw.Device
	cl    *hw.Cluster
	inMB  Input
	spec  cost.ComputeSpec
	costs map[segKey]segCost
	loads map[int]expertShare
	exact string // the expert loads' exactness
	mo    memory.Options
}

// setupPipeline checks in (grad accumulation defaulted) and builds its
// pipelineSetup.
func setupPipeline(in Input) (pipelineSetup, error) {
	if err := checkInput(in); err != nil {
		return pipelineSetup{}, err
	}
	if in.SingleCommStream {
		return pipelineSetup{}, errors.New("simulate: single comm stream with pp > 1 is not modelled")
	}
	cfg, l := in.Config, in.Layout
	dev, cl, err := resolveHardware(in)
	if err != nil {
		return pipelineSetup{}, err
	}
	if err := checkAsyncTP(in); err != nil {
		return pipelineSetup{}, err
	}
	stageL := l.StageLayout()
	if err := checkSkewBound(cfg, stageL, in.ExpertSkew); err != nil {
		return pipelineSetup{}, err
	}
	pl, err := parallel.BuildPipeline(parallel.PipelineSpec{Config: cfg, Layout: l, LBS: in.LBS, Seq: in.Seq, Accum: in.GradAccum,
		Precision: in.Memory.Precision, ReduceDType: in.Memory.ReduceDType, GPUsPerNode: cl.GPUsPerNode})
	if err != nil {
		return pipelineSetup{}, fmt.Errorf("simulate: %w", err)
	}
	mbs := l.PPMicrobatchSize
	// A tp rank's ops at its local shapes (tpOps), as Simulate prices them.
	recs, err := tpOps(cfg, stageL, flops.Shape{Seq: in.Seq, Batch: mbs}, in.AC)
	if err != nil {
		return pipelineSetup{}, fmt.Errorf("simulate: flops: %w", err)
	}
	local, err := tpLocal(cfg, stageL)
	if err != nil {
		return pipelineSetup{}, err
	}
	spec, err := cost.ComputeSpecFor(dev, in.AttentionKernel)
	if err != nil {
		return pipelineSetup{}, fmt.Errorf("simulate: %w", err)
	}
	spec = spec.WithExperts(in.ExpertGEMM).Calibrated(in.Calibration)
	spec.Compiled = in.Memory.Compile.Model
	spec.CompositeNorm = in.Torch.before(fusedNormSince)
	spec.FusedElementwise = in.FusedElementwise
	spec.GPUs = l.GPUs // every rank of the job waits for the slowest GPU, as Simulate
	if err := spec.Validate(); err != nil {
		return pipelineSetup{}, fmt.Errorf("simulate: gpu %s: %w", dev.Name, err)
	}
	inMB := in
	inMB.LBS, inMB.Layout = mbs, stageL
	loads, exact := expertLoads(cfg, stageL, inMB)
	costs, err := opCosts(local, stageL, inMB, spec, recs, loads)
	if err != nil {
		return pipelineSetup{}, err
	}
	return pipelineSetup{pl: pl, dev: dev, cl: cl, inMB: inMB, spec: spec, costs: costs, loads: loads, exact: exact, mo: in.memoryOptions()}, nil
}

// pipelinePrices prices every op of the pipeline: per-stage forward and
// backward of one micro-batch (compute ops from costs, with the stage's
// expert all-to-alls and tensor-parallel collectives), messages on the
// link between the two ranks, FSDP collectives on the stage mesh, each
// rank's optimizer. It also returns the link class of the tp collectives.
func pipelinePrices(pl *parallel.Pipeline, cfg *moe.Config, cl *hw.Cluster, in, inMB Input, spec cost.ComputeSpec, costs map[segKey]segCost, loads map[int]expertShare, mo memory.Options) (pipeCosts, hw.LinkClass, error) {
	l := pl.Layout
	n := l.PipelineStages()
	pc := pipeCosts{fwd: make([]float64, n), bwd: make([]float64, n), rec: make([]float64, n), wgt: make([]float64, n), opt: make([]float64, l.Stages())}
	a2a, err := a2aSeconds(pl, cfg, cl, inMB, spec, loads)
	if err != nil {
		return pipeCosts{}, 0, err
	}
	tpG := tpShape(cl, pl)
	var tpLink hw.LinkClass
	if l.TPDegree() > 1 {
		pc.tpFwd, pc.tpBwd = make([]tpSeconds, n), make([]tpSeconds, n)
		for s := range n {
			for _, c := range pl.StageTPCollectives(cfg, s, in.Seq, in.AC, in.precision().Activation) {
				cc, err := cost.Collective(cl, in.Calibration, c.Coll, tpG, float64(c.Bytes()))
				if err != nil {
					return pipeCosts{}, 0, fmt.Errorf("simulate: %w", err)
				}
				tpLink = cc.Link
				t := cc.Seconds()
				if c.Phase == parallel.PhaseForward {
					pc.fwd[s] += t
					pc.tpFwd[s].add(tpKind(c.Coll), t)
				} else {
					pc.bwd[s] += t
					pc.tpBwd[s].add(tpKind(c.Coll), t)
				}
			}
		}
	}
	// The segments in one fixed order: summed in map order, a stage's
	// seconds differed in the last bit from run to run, and so did the
	// planner's ranking of near-equal plans.
	keys := slices.SortedFunc(maps.Keys(costs), func(a, b segKey) int {
		return cmp.Or(cmp.Compare(a.layer, b.layer), cmp.Compare(a.phase, b.phase), cmp.Compare(a.seg, b.seg))
	})
	for s := range n {
		first, count := pl.StageLayers(s)
		owns := func(layer int) bool {
			return layer >= first && layer < first+count || s == 0 && layer == moe.LayerEmbed || s == n-1 && layer == cfg.LayerHead()
		}
		for _, k := range keys {
			c := costs[k]
			if !owns(k.layer) {
				continue
			}
			switch k.phase {
			case parallel.PhaseForward:
				pc.fwd[s] += c.total
			case parallel.PhaseBackward:
				pc.bwd[s] += c.total
				pc.rec[s] += c.recompute
				pc.wgt[s] += c.weight
			case parallel.PhaseRecompute:
				pc.bwd[s] += c.total
				pc.rec[s] += c.total
			}
		}
		for layer := first; layer < first+count; layer++ {
			pc.fwd[s] += a2a[layer].fwd
			pc.bwd[s] += a2a[layer].bwd
			if in.AC.FullyCheckpointed(layer) || in.AC.MoERecomputed(cfg, layer) {
				// the recompute's all-to-alls (the moe module's re-run too)
				pc.bwd[s] += a2a[layer].fwd
				pc.rec[s] += a2a[layer].fwd
			}
		}
	}
	if l.AsyncTP && l.TPDegree() > 1 {
		if err := asyncPasses(&pc, pl, cfg, cl, inMB, spec, costs, loads, tpG); err != nil {
			return pipeCosts{}, 0, err
		}
	}
	sg := l.StageGPUs()
	pc.msg = func(from, to int) float64 {
		a, b := l.StageRank(from)*sg, l.StageRank(to)*sg
		return cost.P2PSeconds(cl, in.Calibration, cl.Link(a, b), float64(pipeMessageBytes(l, in.Seq, cfg.Hidden)))
	}
	shapes := map[parallel.Axis]cost.GroupShape{}
	var collErr error
	pc.coll = func(o parallel.ScheduleOp) float64 {
		g, ok := shapes[o.Axis]
		if !ok {
			g = cost.ShapeOf(cl, pl.Stage.Group(o.Axis, 0).Ranks)
			if o.Axis == parallel.AxisTP {
				g = tpG
			}
			shapes[o.Axis] = g
		}
		cc, err := cost.Collective(cl, in.Calibration, o.Coll, g, float64(o.Bytes()))
		if err != nil && collErr == nil {
			collErr = err
		}
		// Both parts of FSDP2's copies on the collective: a stage gathers
		// each unit once a step (no reshard after forward under pp), so
		// the copy-out the single-program path charges to the compute
		// stream is one memory pass per unit and step here, not per
		// micro-batch.
		onStream, onCompute := spec.FSDPCopySeconds(o, g.Ranks, in.Memory.Precision)
		return cc.Seconds() + onStream + onCompute
	}
	// Price every collective once now, so that a pricing error is returned
	// rather than met mid-walk.
	for _, ops := range pl.Ranks {
		for _, o := range ops {
			if o.Kind == parallel.PipeColl {
				pc.coll(o.Coll)
			}
		}
	}
	if collErr != nil {
		return pipeCosts{}, 0, fmt.Errorf("simulate: %w", collErr)
	}
	all, err := memory.Units(cfg, l)
	if err != nil {
		return pipeCosts{}, 0, err
	}
	chunks, err := memory.StageUnits(all, pl.Split)
	if err != nil {
		return pipeCosts{}, 0, err
	}
	if mo.Precision == (moe.Precision{}) {
		mo.Precision = moe.DefaultPrecision
	}
	paramType := mo.Precision.Param
	world := make([]int, l.GPUs)
	for i := range world {
		world[i] = i
	}
	norm, err := cost.Collective(cl, in.Calibration, parallel.CollAllReduce, cost.ShapeOf(cl, world), 4)
	if err != nil {
		return pipeCosts{}, 0, err
	}
	for r := range l.Stages() {
		var us []memory.Unit
		for _, s := range l.RankStages(r) {
			us = append(us, chunks[s]...)
		}
		params := float64(memory.StateOf(us, l.Sharding, mo).Params / paramType.Bytes())
		pc.opt[r] = spec.MemorySeconds(params*spec.BytesPerElement(moe.OpOptimizer, moe.Forward)) + spec.GradClipSeconds(params) + norm.Seconds()
	}
	return pc, tpLink, nil
}

// asyncPasses prices each stage's forward and backward of one micro-batch
// under async TP by walking its pass (parallel.Pipeline.StagePass) on the
// engine, as Simulate walks a step: the segments at their costs (costs),
// the all-to-alls and tp collectives as simOps prices them (the tp ones on
// tpG), the overlapped parts on a communication stream beside the compute,
// which runs at the rate Simulate gives it while a collective moves bytes
// there. A pass lasts until its last op ends, and that replaces the summed
// fwd and bwd; its breakdown charges give the tp collectives' exposed
// seconds (first chunks in full, the compute's waits for overlapped
// parts), and their spans how long they ran. Under a zero-bubble schedule
// the backward-input pass is walked on its own, its backward segments
// without their weight-gradient ops (the weight pass, compute only, stays
// wgt): the overlap hides behind the input pass's compute alone. Recompute
// and weight seconds stay the sums.
func asyncPasses(pc *pipeCosts, pl *parallel.Pipeline, cfg *moe.Config, cl *hw.Cluster, inMB Input, spec cost.ComputeSpec, costs map[segKey]segCost, loads map[int]expertShare, tpG cost.GroupShape) error {
	n := pl.Layout.PipelineStages()
	rate := float64(spec.SMs-spec.NCCLCTAs) / float64(spec.SMs)
	walk := func(s int, bwd bool, cs map[segKey]segCost, d *float64, tp *tpSeconds) error {
		ops, err := pl.StagePass(cfg, s, inMB.Seq, inMB.AC, inMB.precision(), bwd)
		if err != nil {
			return fmt.Errorf("simulate: %w", err)
		}
		t, err := passTiming(ops, cl, pl.Stage, tpG, inMB, spec, cs, loads, rate)
		if err != nil {
			return err
		}
		*d, *tp = t.seconds, t.tp
		return nil
	}
	var input map[segKey]segCost
	if pl.Layout.PPSchedule.ZeroBubble() {
		input = make(map[segKey]segCost, len(costs))
		for k, c := range costs {
			if k.phase == parallel.PhaseBackward {
				c.total -= c.weight
			}
			input[k] = c
		}
		pc.inp, pc.tpInp = make([]float64, n), make([]tpSeconds, n)
	}
	for s := range n {
		if err := walk(s, false, costs, &pc.fwd[s], &pc.tpFwd[s]); err != nil {
			return err
		}
		if err := walk(s, true, costs, &pc.bwd[s], &pc.tpBwd[s]); err != nil {
			return err
		}
		if input != nil && s > 0 { // stage 0's input pass does nothing (pipeCosts.compute)
			if err := walk(s, true, input, &pc.inp[s], &pc.tpInp[s]); err != nil {
				return err
			}
		}
	}
	return nil
}

// passTime is one stage pass as the engine walked it.
type passTime struct {
	seconds float64
	tp      tpSeconds
}

// passTiming walks ops, one stage pass, on the engine (see asyncPasses).
func passTiming(ops []parallel.ScheduleOp, cl *hw.Cluster, mesh *parallel.Mesh, tpG cost.GroupShape, in Input, spec cost.ComputeSpec, costs map[segKey]segCost, loads map[int]expertShare, rate float64) (passTime, error) {
	sched := &parallel.Schedule{Layout: mesh.Layout, Ops: ops}
	sim, err := simOps(sched, cl, mesh, tpG, in, spec, costs, optimizerCost{}, loads)
	if err != nil {
		return passTime{}, err
	}
	spans, err := runEngineShared(sim.ops, rate)
	if err != nil {
		return passTime{}, err
	}
	var t passTime
	for _, sp := range spans {
		t.seconds = math.Max(t.seconds, sp.end)
	}
	b, _ := breakdown(sched, sim, spans, t.seconds)
	for k, kind := range tpKinds {
		t.tp.exposed[k] = b.ExposedCommS[string(kind)]
		t.tp.ran[k] = b.CommS[string(kind)]
	}
	return t, nil
}

// tpShape is the shape of the tp group spanning the most NVLink domains
// over every stage (stage p's ranks start at p·StageGPUs): as in
// widestTPGroup, every tp collective blocks its group's computation.
func tpShape(cl *hw.Cluster, pl *parallel.Pipeline) cost.GroupShape {
	l := pl.Layout
	var w cost.GroupShape
	for p := range l.Stages() {
		for _, g := range pl.Stage.Groups(parallel.AxisTP) {
			ranks := make([]int, len(g.Ranks))
			for i, r := range g.Ranks {
				ranks[i] = p*l.StageGPUs() + r
			}
			if s := cost.ShapeOf(cl, ranks); s.Domains > w.Domains {
				w = s
			}
		}
	}
	return w
}

// pipeMessageBytes is one pipeline message: a micro-batch's hidden states
// as one tp rank holds them, seq/tp tokens of each sequence
// (parallel.Pipeline's sequence-parallel boundary).
func pipeMessageBytes(l moe.Layout, seq, hidden int) int64 {
	return int64(l.PPMicrobatchSize) * int64(seq) / int64(l.TPDegree()) * int64(hidden) * moe.DefaultPrecision.Activation.Bytes()
}

type a2aCost struct{ fwd, bwd float64 }

// a2aSeconds is, per MoE layer, the expert-parallel all-to-alls of one
// micro-batch on the stage mesh's EP group: forward the counts exchange
// (with its host sync), dispatch and combine; backward their gradients.
func a2aSeconds(pl *parallel.Pipeline, cfg *moe.Config, cl *hw.Cluster, inMB Input, spec cost.ComputeSpec, loads map[int]expertShare) (map[int]a2aCost, error) {
	out := map[int]a2aCost{}
	l := pl.Stage.Layout
	if l.EP == 1 || !cfg.IsMoE() {
		return out, nil
	}
	g := cost.ShapeOf(cl, pl.Stage.Group(parallel.AxisEP, 0).Ranks)
	// Under tp with etp = 1 each tp rank sends its 1/tp of the rows
	// (Layout.TokensPerExpertRank).
	T := float64(inMB.LBS) * float64(inMB.Seq) / float64(l.TokensPerExpertRank())
	rows := T * float64(cfg.TopK) * float64(cfg.Hidden) * float64(inMB.precision().Activation.Bytes()) *
		dispatchShare(inMB.Dispatcher, cfg, l.EP)
	counts, err := cost.Collective(cl, inMB.Calibration, parallel.CollAllToAll, g, float64(8*cfg.Experts))
	if err != nil {
		return nil, err
	}
	for layer := range cfg.Layers {
		if !cfg.MoELayer[layer] {
			continue
		}
		bytes := rows
		if sh, ok := loads[layer]; ok {
			bytes *= sh.load
		}
		cc, err := cost.Collective(cl, inMB.Calibration, parallel.CollAllToAll, g, bytes)
		if err != nil {
			return nil, err
		}
		one := cc.Seconds()
		out[layer] = a2aCost{fwd: counts.Seconds() + spec.HostSyncSeconds() + 2*one, bwd: 2 * one}
	}
	return out, nil
}

// pipelineTiming reports the walk per pipeline rank.
func pipelineTiming(pl *parallel.Pipeline, w pipeWalk, cl *hw.Cluster, in Input) *PipelineTiming {
	l := pl.Layout
	t := &PipelineTiming{Schedule: l.PPSchedule, Microbatches: pl.M, VirtualStages: l.VirtualStages(),
		MessageBytes:     pipeMessageBytes(l, in.Seq, in.Config.Hidden),
		SimulatedPerRank: "one data-parallel rank of each stage"}
	for r, wr := range w.ranks {
		st := StageTiming{Rank: r, BusyS: wr.busy, OptimizerS: wr.optS, EndS: wr.end, IdleFraction: 1 - (wr.busy+wr.optS)/w.step}
		for _, s := range l.RankStages(r) {
			st.Stages = append(st.Stages, s)
			st.Layers += pl.Split[s]
		}
		t.Stages = append(t.Stages, st)
	}
	sg := l.StageGPUs()
	for s := 0; s+1 < l.PipelineStages(); s++ {
		if l.StageRank(s) == l.StageRank(s+1) {
			t.P2PLink = append(t.P2PLink, "same rank") // the V's bottom: no message
			continue
		}
		t.P2PLink = append(t.P2PLink, cl.Link(l.StageRank(s)*sg, l.StageRank(s+1)*sg).String())
	}
	return t
}

// pipelineBreakdown splits the step of the rank that ends last: its
// compute (recompute apart), optimizer, the FSDP gathers its compute
// waited for (all_gather), the communication that outlasted its compute
// (reduce_scatter), and the rest of its idle time, the pipeline's bubble
// and waits for messages (pipeline_bubble). The parts sum to the step.
func pipelineBreakdown(w pipeWalk) (Breakdown, string) {
	last := 0
	for r, wr := range w.ranks {
		if wr.end > w.ranks[last].end {
			last = r
		}
	}
	wr := w.ranks[last]
	var tp float64
	for _, v := range wr.tp {
		tp += v
	}
	// The tp collectives block the computation: exposed in full (under
	// async TP, what the computation waits for), out of the forward and
	// backward time they sit in.
	b := Breakdown{ComputeS: wr.busy - wr.recompute - (tp - wr.tpOutside), RecomputeS: wr.recompute, OptimizerS: wr.optS,
		ExposedCommS: map[string]float64{}, CommS: map[string]float64{}, ComputeByClassS: map[string]float64{}, OverheadS: map[string]float64{}}
	trailing := math.Max(0, wr.commAt-wr.computeAt)
	b.ExposedCommS[string(parallel.CollAllGather)] = wr.gatherOn
	b.ExposedCommS[string(parallel.CollReduceScatter)] = trailing
	b.ExposedCommS["pipeline_bubble"] = w.step - wr.busy - wr.optS - wr.gatherOn - trailing - wr.tpOutside
	for k, v := range wr.tp {
		if v > 0 {
			b.ExposedCommS[string(tpKinds[k])] += v
		}
		if v := wr.tpRan[k]; v > 0 {
			b.CommS[string(tpKinds[k])] += v
		}
	}
	for _, sp := range wr.spans {
		if !sp.comm || sp.op.Kind == parallel.PipeColl && sp.op.Coll.Axis == parallel.AxisTP {
			continue // tp collectives: counted above
		}
		k := "p2p"
		if sp.op.Kind == parallel.PipeColl {
			k = string(sp.op.Coll.Coll)
		}
		b.CommS[k] += sp.end - sp.start
	}
	return b, bottleneck(b, nil)
}

// writePipelineTrace is WriteTrace for a pipeline (see there).
func (r *Result) writePipelineTrace(w io.Writer) error {
	var evs []traceEvent
	for rk, wr := range r.pipe.ranks {
		st := r.Pipeline.Stages[rk]
		evs = append(evs, traceEvent{Name: "process_name", Ph: "M", PID: rk, Args: map[string]any{"name": fmt.Sprintf("pp rank %d (stages %v)", rk, st.Stages)}})
		for tid, name := range []string{"compute", "comm", "p2p"} {
			evs = append(evs, traceEvent{Name: "thread_name", Ph: "M", PID: rk, TID: tid, Args: map[string]any{"name": name}})
		}
		for _, sp := range wr.spans {
			e := traceEvent{Ph: "X", PID: rk, TS: sp.start * 1e6, Dur: (sp.end - sp.start) * 1e6,
				Args: map[string]any{"stage": sp.op.Stage, "micro": sp.op.Micro}}
			switch sp.op.Kind {
			case parallel.PipeColl:
				e.TID, e.Cat = 1, "comm"
				e.Name = fmt.Sprintf("%s %s %s", sp.op.Coll.Coll, sp.op.Coll.Purpose, sp.op.Coll.Unit)
				e.Args["bytes"] = sp.op.Coll.Bytes()
			case parallel.PipeSend:
				e.TID, e.Cat = 2, "p2p"
				e.Name = fmt.Sprintf("send %d→%d", sp.op.Stage, sp.op.Peer)
				e.Args["bytes"], e.Args["grad"] = sp.op.Bytes, sp.op.Grad
			default:
				e.Cat = "compute"
				e.Name = fmt.Sprintf("%s s%d m%d", sp.op.Kind, sp.op.Stage, sp.op.Micro)
			}
			evs = append(evs, e)
		}
		if wr.optS > 0 {
			evs = append(evs, traceEvent{Ph: "X", PID: rk, Cat: "compute", Name: "optimizer", TS: (wr.end - wr.optS) * 1e6, Dur: wr.optS * 1e6})
		}
	}
	b, err := json.Marshal(struct {
		Unit   string       `json:"displayTimeUnit"`
		Events []traceEvent `json:"traceEvents"`
	}{"ms", evs})
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
