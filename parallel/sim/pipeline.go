package sim

import (
	"errors"
	"fmt"
	"math"

	"github.com/moescope/moescope/internal/band"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/memory/verdict"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/epbuffer"
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
	Schedule         job.PPSchedule `json:"schedule"`
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
	// Memory and the FLOPs per token are the run's own (memory folds cp
	// itself; MFU counts the whole sequence); the prices and the tokens
	// are a cp rank's, su.in (cp folded, pipelineSetup).
	cfg, l, pl, dev, cl, exact := in.Model, in.Layout, su.pl, su.dev, su.cl, su.exact
	mem, err := memory.Estimate(cfg, l, memory.Batch{LBS: in.LBS, Seq: in.Seq, GradAccum: in.GradAccum}, su.mo)
	if err != nil {
		return Result{}, fmt.Errorf("simulate: memory: %w", err)
	}
	convs, hwFLOP, err := flopsPerToken(cfg, in)
	if err != nil {
		return Result{}, err
	}
	pc, tpLink, err := pipelinePrices(pl, cfg, cl, su.in, su.inMB, su.spec, su.costs, su.loads, su.mo)
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
	// Under cp a rank's sequences are seq/cp long (su.in.Seq).
	tokens := float64(in.LBS) * float64(su.in.Seq) * float64(in.GradAccum) / float64(l.Stages()*l.TPDegree())
	res.TPS = tokens / res.StepTimeS
	res.setMFU(dev, in.Precision, convs, hwFLOP)
	res.Calibrated = in.Calibration != nil
	res.setIntervals(band.Uncalibrated().TPS.Of(res.TPS), IntervalBand)
	// The pipeline's peak is the worst pipeline rank's, already replayed:
	// a calibration re-prices its reserved bytes with its overhead.
	peak := mem.Peak
	if cal := in.Calibration; cal != nil && cal.AllocatorOverhead > 0 {
		peak.Reserved = peak.ReservedWith(cal.AllocatorOverhead)
	}
	res.PeakAllocatedBytes, res.PeakReservedBytes = peak.Allocated, peak.Reserved
	res.MemoryFraction = float64(peak.Reserved) / float64(dev.MemoryBytes)
	target := in.MemoryTarget
	if target == 0 {
		target = verdict.DefaultMemoryTarget
	}
	es := in.Spec
	es.Layout, es.Model = l, cfg
	outside, err := epbuffer.Outside(dev, es, cl.NVLinkDomain)
	if err != nil {
		return Result{}, fmt.Errorf("simulate: %w", err)
	}
	res.Fit = verdict.Judge(peak.Reserved, outside, dev.MemoryBytes, target)
	res.Pipeline = pipelineTiming(pl, walk, cl, su.in)
	if su.in.cp.cp > 1 {
		res.CPLink = su.in.cp.link.String()
	}
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
// program, the hardware, the input as a cp rank runs it (in: cp folded,
// cpFold), in at one micro-batch on the stage layout (inMB), the compute
// spec, the stage's segment costs at that shape and the expert loads.
type pipelineSetup struct {
	pl    *parallel.Pipeline
	in    Input
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
	dev, cl, err := resolveHardware(in)
	if err != nil {
		return pipelineSetup{}, err
	}
	orig := in.Spec
	if in, err = cpFold(in, cl); err != nil {
		return pipelineSetup{}, err
	}
	cfg, l := in.Model, in.Layout
	if err := checkAsyncTP(in); err != nil {
		return pipelineSetup{}, err
	}
	if err := checkKnobs(in); err != nil {
		return pipelineSetup{}, err
	}
	stageL := l.StageLayout()
	stageSpec := in.Spec
	stageSpec.Layout = stageL
	if err := checkSkewBound(stageSpec); err != nil {
		return pipelineSetup{}, err
	}
	pl, err := parallel.BuildPipeline(parallel.PipelineSpec{Spec: in.Spec, GPUsPerNode: cl.GPUsPerNode})
	if err != nil {
		return pipelineSetup{}, fmt.Errorf("simulate: %w", err)
	}
	mbs := l.PPMicrobatchSize
	// A tp rank's ops at its local shapes (tpOps), as Simulate prices them.
	// Under cp attention spans the whole sequence (cpOps).
	stage := orig
	stage.Layout, stage.LBS = orig.StageLayout(), mbs
	recs, err := cpOps(stage, stage.FoldCP())
	if err != nil {
		return pipelineSetup{}, fmt.Errorf("simulate: flops: %w", err)
	}
	local, err := tpLocal(cfg, stageL)
	if err != nil {
		return pipelineSetup{}, err
	}
	spec, err := computeSpec(dev, in, in.Calibration)
	if err != nil {
		return pipelineSetup{}, err
	}
	waitsFor(&spec, l, cl)
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
	return pipelineSetup{pl: pl, in: in, dev: dev, cl: cl, inMB: inMB, spec: spec, costs: costs, loads: loads, exact: exact, mo: in.MemoryOptions()}, nil
}

// pipelineTiming reports the walk per pipeline rank.
func pipelineTiming(pl *parallel.Pipeline, w pipeWalk, cl *hw.Cluster, in Input) *PipelineTiming {
	l := pl.Layout
	t := &PipelineTiming{Schedule: l.PPSchedule, Microbatches: pl.M, VirtualStages: l.VirtualStages(),
		MessageBytes:     pipeMessageBytes(l, in.Seq, in.Model.Hidden),
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
	cpBreakdown(&b, wr.cp)
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
