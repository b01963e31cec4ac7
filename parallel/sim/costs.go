package sim

import (
	"fmt"
	"math"
	"slices"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// From the cost models to the engine: compute ops priced per (layer,
// segment, phase) from their exact counts, collectives from cost.Collective on
// their group's shape, each placed on the stream it runs on.

// simulated holds the per-op costs of a schedule.
type simulated struct {
	ops       []simOp
	recompute []float64    // recompute seconds inside each compute op
	cp        []cpCharge   // context-parallel exchanges inside each compute op (cp.go)
	cpLink    hw.LinkClass // the cp ring's slowest hop
	comm      []cost.Comm
	bytes     []float64 // collectives: the size S modelled (after expert load)
	byClass   [][cost.NumOpClasses]float64
	over      [numOverheads]float64 // seconds of each overhead over the step
}

// segKey names one compute op of a schedule.
type segKey struct {
	layer int
	seg   parallel.Segment
	phase parallel.Phase
}

type segCost struct {
	total, recompute float64
	byClass          [cost.NumOpClasses]float64 // total split by op class
	over             [numOverheads]float64      // overheads inside total

	weight float64 // the backward-weight ops inside total (PhaseBackward)
	// cp is the context-parallel exchange inside the op (cp.go); its
	// exposed part is inside total.
	cp cpCharge
}

// opCosts sums modelled op times per (layer, segment, phase) for one
// micro-step of the simulated rank. Counts come from flops.Ops with a GPU
// flash-attention tile (flops.DefaultTile): the work the GPU executes.
func opCosts(cfg *moe.Config, l job.Layout, in Input, spec cost.ComputeSpec, recs []moe.OpRecord, loads map[int]expertShare) (map[segKey]segCost, error) {
	type opKey struct {
		layer int
		op    moe.Op
	}
	var fwd map[opKey]int64 // forward counts, made at the first recompute that reads them
	local := 1
	if cfg.IsMoE() {
		local = cfg.Experts / l.EP
	}
	costs := newSegCosts()
	var cls int
	var over [numOverheads]float64 // of the op being added
	addCost := func(k segKey, t, rec float64) {
		c := costs.at(k)
		c.total += t
		c.recompute += rec
		// The quantize kernels inside a converted GEMM's price are
		// memory-bound work.
		q := over[ohQuantize]
		c.byClass[cls] += t - q
		c.byClass[cost.ClassMemoryBound] += q
		for i, v := range over {
			c.over[i] += v
		}
	}
	// opSeconds prices r and sets over to its launch, loss and clock shares.
	captured := func(r moe.OpRecord) bool { return graphed(cfg, in, r) }
	opSeconds := pricedOnce(overheadPricer(cfg, spec, local, &over, captured), &over, captured)
	routing := spec
	if in.CUDAGraphs == job.FullGraphs { // the reorder's kernels are captured with the step
		routing.LaunchS = 0
	}
	addRouting(costs, cfg, in, routing)
	for _, r := range recs {
		block := r.Layer >= 0 && r.Layer < cfg.Layers
		seg := parallel.SegmentOf(r.Op, block && cfg.MoELayer[r.Layer])
		share, skewed := loads[r.Layer]
		if !skewed {
			share = expertShare{load: 1}
		}
		groups := share.groups
		if r.Op.Kind() == moe.KindGrouped && share.load != 1 {
			r.Count = int64(math.Round(float64(r.Count) * share.load))
		}
		t, err := opSeconds(r, groups)
		if err != nil {
			return nil, err
		}
		c, _ := cost.OpClassOf(r.Op) // OpSeconds has checked it
		cls = int(c)
		if err := chargeCP(costs, in, r, seg, t, block && reRun(cfg, in.AC, r.Layer, r.Op)); err != nil {
			return nil, err
		}
		switch r.Pass {
		case moe.Forward:
			addCost(segKey{r.Layer, seg, parallel.PhaseForward}, t, 0)
			if block && reRun(cfg, in.AC, r.Layer, r.Op) {
				addCost(segKey{r.Layer, seg, parallel.PhaseRecompute}, t, t)
			}
		case moe.BackwardData, moe.BackwardWeight:
			k := segKey{r.Layer, seg, parallel.PhaseBackward}
			addCost(k, t, 0)
			if r.Pass == moe.BackwardWeight {
				costs.at(k).weight += t
			}
		case moe.Recompute:
			if block && reRun(cfg, in.AC, r.Layer, r.Op) {
				// The block's (or MoE layer's) forward repeat is the
				// PhaseRecompute op; what the record holds beyond it (flash
				// attention's own QKᵀ, moe_act's activation inside the MoE
				// layer's recompute) runs inside backward.
				if fwd == nil {
					fwd = map[opKey]int64{}
					for _, f := range recs {
						if f.Pass == moe.Forward {
							fwd[opKey{f.Layer, f.Op}] = f.Count
						}
					}
				}
				extra := r.Count - fwd[opKey{r.Layer, r.Op}]
				if extra <= 0 {
					continue
				}
				r.Count = extra
				if t, err = opSeconds(r, groups); err != nil {
					return nil, err
				}
			}
			addCost(segKey{r.Layer, seg, parallel.PhaseBackward}, t, t)
		}
	}
	return costs.byKey(), nil
}

// segCosts accumulates opCosts' charges, each key's in one slot found by
// one map lookup a charge (a segKey hashes its segment's name; a map of
// values took two, a read and a write), in the order they are charged:
// the sums are those of charging the returned map directly.
type segCosts struct {
	slot map[segKey]int
	acc  []segCost
}

func newSegCosts() *segCosts { return &segCosts{slot: map[segKey]int{}} }

// at is k's cost, zero at first; the pointer holds until the next at.
func (s *segCosts) at(k segKey) *segCost {
	i, ok := s.slot[k]
	if !ok {
		i = len(s.acc)
		s.slot[k] = i
		s.acc = append(s.acc, segCost{})
	}
	return &s.acc[i]
}

// byKey is the accumulated costs by key.
func (s *segCosts) byKey() map[segKey]segCost {
	out := make(map[segKey]segCost, len(s.acc))
	for k, i := range s.slot {
		out[k] = s.acc[i]
	}
	return out
}

// overheadPricer returns opCosts' opSeconds: it prices an op record on one
// GPU (spec.OpSeconds, local experts per EP rank) and sets *over to the
// parts of that price the overheads name: the launch floor's, the loss's,
// a tensor-core op's loss to the clock, split between the sustained
// clock, the slowest GPU and the slowest node, and a converted GEMM's
// quantize kernels. An op captured in a CUDA graph (captured) is priced
// without the launch floor, which it names as cuda_graphs_saved instead.
func overheadPricer(cfg *moe.Config, spec cost.ComputeSpec, local int, over *[numOverheads]float64, captured func(moe.OpRecord) bool) func(moe.OpRecord, []float64) (float64, error) {
	noLaunch := spec
	noLaunch.LaunchS = 0
	// The same without the spread between nodes (what the slowest node
	// costs is the difference), and at the burst clock, for the clock
	// overheads' shares.
	oneNode := noLaunch
	oneNode.NodeSpread = 0
	nodes := spec.Clock() < oneNode.Clock()
	burst := oneNode
	burst.Sustained, burst.SpeedSD = 1, 0
	sus := spec.SustainedRatio()
	// susShare is the sustained clock's part of what an op loses to the
	// clock: a compute-bound op takes tb/sus at the mean GPU's clock and
	// tb/(sus·slowest) on the slowest, so of t0 − tb the sustained clock
	// costs (1/sus − 1)/(1/clock − 1), exactly (an op bound by HBM at both
	// clocks loses nothing; one that crosses over between them is split
	// in the same proportion).
	clocked := oneNode.Clock() < 1
	susShare := 0.0
	if clocked {
		susShare = (1/sus - 1) / (1/oneNode.Clock() - 1)
	}
	return func(r moe.OpRecord, groups []float64) (float64, error) {
		t, err := spec.OpSeconds(cfg, r, local, groups)
		if err != nil {
			return 0, err
		}
		t0, _ := noLaunch.OpSeconds(cfg, r, local, groups)
		*over = [numOverheads]float64{}
		if captured(r) {
			over[ohGraphSaved], t = t-t0, t0
		} else {
			over[ohLaunch] = t - t0
		}
		if r.Op == moe.OpLoss {
			over[ohLoss] = t
		}
		over[ohQuantize] = spec.CastSeconds(cfg, r, local)
		if c, _ := cost.OpClassOf(r.Op); c != cost.ClassMemoryBound && clocked {
			t1 := t0
			if nodes {
				t1, _ = oneNode.OpSeconds(cfg, r, local, groups)
				over[ohSlowestNode] = t0 - t1
			}
			tb, _ := burst.OpSeconds(cfg, r, local, groups)
			over[ohSustainedClock] = (t1 - tb) * susShare
			over[ohSlowestGPU] = (t1 - tb) * (1 - susShare)
		}
		return t, nil
	}
}

// pricedOnce returns price remembering each distinct record's price and
// the overheads it sets in *over: a block's records repeat layer after
// layer, and what prices them reads no layer (cost.ComputeSpec.OpSeconds
// and CastSeconds read the op, pass and count; the pricer also whether the
// record is captured and the layer's expert loads groups, keyed by the
// slice's identity: one slice per layer's loads). The same inputs give the
// same price, so the cache changes no result.
func pricedOnce(price func(moe.OpRecord, []float64) (float64, error), over *[numOverheads]float64, captured func(moe.OpRecord) bool) func(moe.OpRecord, []float64) (float64, error) {
	type key struct {
		op       moe.Op
		pass     moe.Pass
		count    int64
		captured bool
		groups   *float64
		nGroups  int
	}
	type priced struct {
		t    float64
		over [numOverheads]float64
	}
	seen := map[key]priced{}
	return func(r moe.OpRecord, groups []float64) (float64, error) {
		k := key{op: r.Op, pass: r.Pass, count: r.Count, captured: captured(r), nGroups: len(groups)}
		if len(groups) > 0 {
			k.groups = &groups[0]
		}
		if p, ok := seen[k]; ok {
			*over = p.over
			return p.t, nil
		}
		t, err := price(r, groups)
		if err == nil {
			seen[k] = priced{t, *over}
		}
		return t, err
	}
}

// streamOf maps a schedule op to an engine stream.
func streamOf(o parallel.ScheduleOp, single bool) simStream {
	if o.Type == parallel.OpCompute {
		return simCompute
	}
	// Tensor-parallel collectives block the computation (their own process
	// group's stream, waited on before the op that reads them), but for
	// the overlapped part of an async one.
	if o.Axis == parallel.AxisTP && !o.AsyncPart {
		return simCompute
	}
	if single {
		return simGather
	}
	switch {
	case o.Coll == parallel.CollAllToAll:
		return simCompute
	case o.Purpose == parallel.PurposeGather || o.Purpose == parallel.PurposeRegather:
		return simGather
	case o.Purpose == parallel.PurposeGradReplica:
		return simAllReduce
	}
	return simReduce
}

// simOps turns the schedule into engine ops with modelled costs.
// The tp axis's collectives are priced on tpG (widestTPGroup, or a
// pipeline's tpShape). With detail it also keeps, op by op, what the
// breakdown reads (recompute, op classes, context-parallel exchanges,
// collectives' prices and sizes); a step time alone (Prepared.TPS) reads
// only the engine's ops, the same either way.
func simOps(s *parallel.Schedule, cl *hw.Cluster, mesh *parallel.Mesh, tpG cost.GroupShape, in Input, spec cost.ComputeSpec, costs map[segKey]segCost, opt optimizerCost, loads map[int]expertShare, detail bool) (*simulated, error) {
	n := len(s.Ops)
	sim := &simulated{ops: make([]simOp, n)}
	if detail {
		sim.recompute, sim.comm, sim.bytes, sim.byClass = make([]float64, n), make([]cost.Comm, n), make([]float64, n), make([][cost.NumOpClasses]float64, n)
	}
	shapes := map[parallel.Axis]cost.GroupShape{}
	share := 1.0 // the rows the dispatcher sends (dispatchShare)
	if in.Dispatcher.RowPerRank() && in.Model != nil {
		share = dispatchShare(in.Dispatcher, in.Model, mesh.Group(parallel.AxisEP, 0).Size())
	}
	var copies []computeCopy
	sim.cpLink = in.cp.link
	for i, o := range s.Ops {
		so := simOp{stream: streamOf(o, in.SingleCommStream), deps: o.Deps}
		if o.Type == parallel.OpCompute {
			if o.Phase == parallel.PhaseOptimizer {
				so.compute = opt.update + opt.clip + opt.amax
				sim.over[ohGradClip] += opt.clip
				sim.over[ohAmaxReduce] += opt.amax
			} else {
				c := costs[segKey{o.Layer, o.Segment, o.Phase}]
				so.compute = c.total
				if detail {
					sim.recompute[i], sim.byClass[i] = c.recompute, c.byClass
					if c.cp != (cpCharge{}) {
						// Made at the first exchange: without CP none is
						// charged (chargeCP), and readers take nil as none.
						if sim.cp == nil {
							sim.cp = make([]cpCharge, n)
						}
						sim.cp[i] = c.cp
					}
				}
				for k, v := range c.over {
					sim.over[k] += v
				}
			}
			sim.ops[i] = so
			continue
		}
		g, ok := shapes[o.Axis]
		if !ok {
			g = cost.ShapeOf(cl, mesh.Group(o.Axis, 0).Ranks)
			if o.Axis == parallel.AxisTP {
				g = tpG
			}
			shapes[o.Axis] = g
		}
		bytes := float64(o.Bytes())
		if o.Coll == parallel.CollAllToAll && o.Purpose != parallel.PurposeCounts {
			if sh, ok := loads[o.Layer]; ok {
				bytes *= sh.load
			}
			bytes *= share
		}
		kind := parallel.CollKind(o.Coll)
		switch o.Coll {
		case parallel.CollBroadcast:
			kind = parallel.CollAllGather // a ring broadcast moves (n−1)/n·S per rank like an all-gather
		case parallel.CollBarrier:
			kind, bytes = parallel.CollAllReduce, 0
		}
		cc, err := cost.Collective(cl, in.Calibration, kind, g, bytes)
		if err != nil {
			return nil, fmt.Errorf("simulate: op %d: %w", i, err)
		}
		if o.Coll == parallel.CollBarrier && g.Ranks > 1 {
			cc.LatencyS = cl.BaseLatencyUS * 1e-6
		}
		cc.Kind = parallel.CollKind(o.Coll)
		// FSDP2's copies: the part on the collective's own stream delays
		// it; the part on the compute stream is charged to the compute op
		// that runs it (chargeComputeCopies). The split-size copy to the host
		// stalls the stream that waits on it.
		var fixed float64
		onStream, onCompute := spec.FSDPCopySeconds(o, g.Ranks, in.Storage())
		fixed += onStream
		sim.over[ohFSDPCopy] += onStream + onCompute
		if onCompute > 0 {
			copies = append(copies, computeCopy{i, onCompute})
		}
		if o.Purpose == parallel.PurposeCounts && g.Ranks > 1 {
			fixed += spec.HostSyncSeconds()
			sim.over[ohHostSync] += spec.HostSyncSeconds()
		}
		cc.LatencyS += fixed
		if detail {
			sim.comm[i], sim.bytes[i] = cc, bytes
		}
		so.coll, so.lat, so.work, so.link = true, cc.LatencyS, cc.BandwidthS, cc.Link
		so.side = streamOf(o, in.SingleCommStream) != simCompute
		sim.ops[i] = so
	}
	sim.chargeComputeCopies(s, copies)
	return sim, nil
}

// reRun reports whether block layer's op runs again, as a PhaseRecompute
// op of the schedule, before the block's backward: every op of a fully
// checkpointed block, the MoE layer's ops under the moe module.
func reRun(cfg *moe.Config, ac moe.AC, layer int, op moe.Op) bool {
	return ac.FullyCheckpointed(layer) || ac.MoERecomputed(cfg, layer) && moe.InMoELayer(op)
}

// computeCopy is the compute-stream part of FSDP2's copies around
// collective op (cost.ComputeSpec.FSDPCopySeconds).
type computeCopy struct {
	op      int
	seconds float64
}

// chargeComputeCopies adds each collective's compute-stream copy to the
// compute op that runs it, as memory-bound work: an all-gather's copy-out
// to the first compute op that waits for the gather (the unit's unshard
// wait), a reduce-scatter's copy-in to the compute op it follows (the
// post-backward hook runs it on the compute stream before handing the
// buffer to the collective), through any tensor-parallel collective
// between them. A copy with no such compute op stays on its collective.
func (sim *simulated) chargeComputeCopies(s *parallel.Schedule, copies []computeCopy) {
	for _, c := range copies {
		j := -1
		if s.Ops[c.op].Purpose == parallel.PurposeGather {
			// The consumer follows its gather (prefetched a unit ahead).
			for k := c.op + 1; k < len(s.Ops) && j < 0; k++ {
				if s.Ops[k].Type == parallel.OpCompute && slices.Contains(s.Ops[k].Deps, c.op) {
					j = k
				}
			}
		} else {
			for k := c.op; j < 0 && len(s.Ops[k].Deps) > 0; {
				if k = s.Ops[k].Deps[0]; s.Ops[k].Type == parallel.OpCompute {
					j = k
				}
			}
		}
		if j < 0 {
			sim.ops[c.op].lat += c.seconds
			if sim.comm != nil { // simOps' detail
				sim.comm[c.op].LatencyS += c.seconds
			}
			continue
		}
		sim.ops[j].compute += c.seconds
		if sim.byClass != nil {
			sim.byClass[j][cost.ClassMemoryBound] += c.seconds
		}
	}
}

// optimizerCost is the optimizer phase: the AdamW update and the gradient
// clipping before it (its norm all-reduce included).
type optimizerCost struct{ update, clip, amax float64 }

// addRouting adds each MoE layer's token reorder (cost.ComputeSpec.RoutingSeconds)
// to its pre-expert segment, forward and, when the block or its MoE layer
// is recomputed whole, recompute, as memory-bound time named routing.
func addRouting(costs *segCosts, cfg *moe.Config, in Input, spec cost.ComputeSpec) {
	// Under tp with etp = 1 each tp rank reorders its 1/tp of the rows.
	t := spec.RoutingSeconds(cfg, int64(in.LBS)*int64(in.Seq)/int64(in.Layout.TokensPerExpertRank()))
	add := func(k segKey, rec float64) {
		c := costs.at(k)
		c.total += t
		c.recompute += rec
		c.byClass[cost.ClassMemoryBound] += t
		c.over[ohRouting] += t
	}
	for layer := 0; layer < cfg.Layers; layer++ {
		if !cfg.MoELayer[layer] {
			continue
		}
		add(segKey{layer, parallel.SegPre, parallel.PhaseForward}, 0)
		if in.AC.FullyCheckpointed(layer) || in.AC.MoERecomputed(cfg, layer) {
			add(segKey{layer, parallel.SegPre, parallel.PhaseRecompute}, t)
		}
	}
}

// widestTPGroup is the shape of the tp group spanning the most NVLink
// domains: when tp does not divide the domain size some groups straddle two
// domains, and as every tp collective blocks its group's computation, the
// step waits for those.
func widestTPGroup(cl *hw.Cluster, mesh *parallel.Mesh) cost.GroupShape {
	var w cost.GroupShape
	for _, g := range mesh.Groups(parallel.AxisTP) {
		if s := cost.ShapeOf(cl, g.Ranks); s.Domains > w.Domains {
			w = s
		}
	}
	return w
}
