package sim

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// The pipeline's prices (pipeline.go says what the walk does with them):
// per stage and micro-batch its compute, all-to-alls and tensor-parallel
// collectives, the messages between stages, the FSDP collectives and each
// pipeline rank's optimizer step.

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
	tpLink, err := stageTPPrices(&pc, pl, cfg, cl, in, tpG)
	if err != nil {
		return pipeCosts{}, 0, err
	}
	stageSums(&pc, pl, cfg, in, costs, a2a)
	if l.AsyncTP && l.TPDegree() > 1 {
		if err := asyncPasses(&pc, pl, cfg, cl, inMB, spec, costs, loads, tpG); err != nil {
			return pipeCosts{}, 0, err
		}
	}
	if err := pipelineTransfers(&pc, pl, cfg, cl, in, spec, tpG); err != nil {
		return pipeCosts{}, 0, err
	}
	if err := pipelineOptimizers(&pc, pl, cfg, cl, in, spec, mo); err != nil {
		return pipeCosts{}, 0, err
	}
	return pc, tpLink, nil
}

// stageTPPrices adds to each stage's forward and backward its layers'
// tensor-parallel collectives (parallel.Pipeline.StageTPCollectives),
// priced on tpG, and returns their link class (none without tp).
func stageTPPrices(pc *pipeCosts, pl *parallel.Pipeline, cfg *moe.Config, cl *hw.Cluster, in Input, tpG cost.GroupShape) (hw.LinkClass, error) {
	l, n := pl.Layout, pl.Layout.PipelineStages()
	var tpLink hw.LinkClass
	if l.TPDegree() > 1 {
		pc.tpFwd, pc.tpBwd = make([]tpSeconds, n), make([]tpSeconds, n)
		for s := range n {
			for _, c := range pl.StageTPCollectives(cfg, s, in.Seq, in.AC, in.Storage().Activation) {
				cc, err := cost.Collective(cl, in.Calibration, c.Coll, tpG, float64(c.Bytes()))
				if err != nil {
					return 0, fmt.Errorf("simulate: %w", err)
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
	return tpLink, nil
}

// stageSums adds to each stage's forward, backward, recompute and weight
// seconds the segment costs of the layers it owns (the embedding on the
// first stage, the head on the last) and its MoE layers' all-to-alls.
func stageSums(pc *pipeCosts, pl *parallel.Pipeline, cfg *moe.Config, in Input, costs map[segKey]segCost, a2a map[int]a2aCost) {
	n := pl.Layout.PipelineStages()
	if in.cp.cp > 1 {
		pc.cpFwd, pc.cpBwd = make([]cpCharge, n), make([]cpCharge, n)
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
				pc.rec[s] += c.total - c.cp.exposedSum() // the re-run's exchange is CP's (cpBreakdown)
			}
			if pc.cpFwd != nil {
				if k.phase == parallel.PhaseForward {
					pc.cpFwd[s].add(c.cp)
				} else {
					pc.cpBwd[s].add(c.cp)
				}
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
}

// pipelineTransfers sets pc's messages (on the link between the two
// stages' ranks) and FSDP collectives (on the stage mesh, tp ones on tpG,
// FSDP2's copies included), each collective priced once now.
func pipelineTransfers(pc *pipeCosts, pl *parallel.Pipeline, cfg *moe.Config, cl *hw.Cluster, in Input, spec cost.ComputeSpec, tpG cost.GroupShape) error {
	l := pl.Layout
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
		onStream, onCompute := spec.FSDPCopySeconds(o, g.Ranks, in.Storage())
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
		return fmt.Errorf("simulate: %w", collErr)
	}
	return nil
}

// pipelineOptimizers sets each pipeline rank's optimizer step: fused AdamW
// over the parameters of its stages' units, and gradient clipping with its
// all-reduce of the norm over the world.
func pipelineOptimizers(pc *pipeCosts, pl *parallel.Pipeline, cfg *moe.Config, cl *hw.Cluster, in Input, spec cost.ComputeSpec, mo memory.Options) error {
	l := pl.Layout
	all, err := memory.Units(cfg, l)
	if err != nil {
		return err
	}
	chunks, err := memory.StageUnits(all, pl.Split)
	if err != nil {
		return err
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
		return err
	}
	micro, err := l.Microbatches(in.LBS)
	if err != nil {
		return err
	}
	micro *= max(in.GradAccum, 1)
	for r := range l.Stages() {
		var us []memory.Unit
		for _, s := range l.RankStages(r) {
			us = append(us, chunks[s]...)
		}
		params := float64(memory.StateOf(us, l.Sharding, mo).Params / paramType.Bytes())
		pc.opt[r] = spec.MemorySeconds(params*spec.BytesPerElement(moe.OpOptimizer, moe.Forward)) + spec.GradClipSeconds(params) + norm.Seconds()
		amax, err := amaxReduceSeconds(cl, in.Calibration, in.Recipe, cfg, l, us, world[:l.GPUs/l.Stages()], float64(micro*len(l.RankStages(r))))
		if err != nil {
			return err
		}
		pc.opt[r] += amax
	}
	return nil
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
		ops, err := pl.StagePass(cfg, s, inMB.Seq, inMB.AC, inMB.Storage(), bwd)
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
	sim, err := simOps(sched, cl, mesh, tpG, in, spec, costs, optimizerCost{}, loads, true)
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
func pipeMessageBytes(l job.Layout, seq, hidden int) int64 {
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
	rows := T * float64(cfg.TopK) * float64(cfg.Hidden) * float64(inMB.Storage().Activation.Bytes()) *
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
