package sim

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
)

// Input is one layout to predict: model, layout, checkpointing, batch,
// hardware and an optional calibration.
type Input struct {
	Config    *moe.Config
	Layout    moe.Layout // resolved (moe.Layout.Resolve); GPUsPerNode 0 = the cluster's
	AC        moe.AC
	LBS       int // sequences per rank per micro-step
	Seq       int // tokens per sequence
	GradAccum int // micro-steps per optimizer step; 0 means 1
	Device    hw.Device
	// Cluster describes hosts and links; nil means ClusterForGPU(Device.Name).
	Cluster     *hw.Cluster
	Calibration *Calibration
	// ExpertSkew ≥ 1 makes the most loaded expert-parallel rank receive
	// ExpertSkew × the mean rows (balanced within the rank); 0 or 1 is
	// balanced routing.
	ExpertSkew float64
	// ExpertCounts, when set, are the rows each routed expert receives in
	// one micro-step from one EP group, as a numeric run records them: one
	// row of len = experts per MoE layer in layer order, or a single row
	// used for every MoE layer; every micro-step uses the same counts.
	// They override ExpertSkew.
	ExpertCounts [][]int64
	// SingleCommStream runs the schedule's communication stream as one
	// stream (no FSDP2 side streams; all-to-alls stay on it).
	SingleCommStream bool
	// KeepTimeline keeps per-op spans for traces.
	KeepTimeline bool
}

// Breakdown splits the step time of the simulated (slowest) rank along
// its critical path, the compute stream: busy time is compute, recompute
// or optimizer; idle time is exposed communication, charged to the
// collective the next compute op waited for (all-to-alls that run inline on
// the compute stream are exposed in full). The parts sum to the step time.
type Breakdown struct {
	ComputeS   float64 `json:"compute_s"`
	RecomputeS float64 `json:"recompute_s"`
	OptimizerS float64 `json:"optimizer_s"`
	// ExposedCommS is keyed by collective kind (all_gather, reduce_scatter,
	// all_reduce, all_to_all).
	ExposedCommS map[string]float64 `json:"exposed_comm_s"`
	// CommS is the total time collectives ran (overlapped or not), by kind.
	CommS map[string]float64 `json:"comm_s"`
	// ComputeByClassS splits compute + recompute by op class (gemm,
	// grouped_gemm, attention, memory_bound; launch overheads included).
	ComputeByClassS map[string]float64 `json:"compute_by_class_s"`
}

// Result is the prediction for one layout.
type Result struct {
	Device  string `json:"gpu"`
	Cluster string `json:"cluster"`
	// StepTimeS is one optimizer step (all micro-steps), seconds.
	StepTimeS float64 `json:"step_time_s"`
	// TPS is a rank's own tokens per second (torchtitan's definition).
	TPS float64 `json:"tps"`
	// MFU uses the torchtitan FLOP convention; MFUByConvention holds every
	// convention flops knows; HFU the hardware count (recompute included).
	MFU             float64            `json:"mfu"`
	HFU             float64            `json:"hfu"`
	MFUByConvention map[string]float64 `json:"mfu_by_convention"`
	// Memory: the memory package's step timeline replayed through its
	// allocator model (the calibrated one when a calibration sets it).
	PeakAllocatedBytes int64     `json:"peak_allocated_bytes"`
	PeakReservedBytes  int64     `json:"peak_reserved_bytes"`
	DeviceBytes        int64     `json:"device_bytes"`
	MemoryFraction     float64   `json:"memory_fraction"`
	Breakdown          Breakdown `json:"breakdown"`
	// Bottleneck names the largest part of the breakdown.
	Bottleneck string `json:"bottleneck"`
	// Exactness says which ranks were simulated and why that is exact.
	Exactness string `json:"exactness"`

	Schedule  *parallel.Schedule `json:"-"`
	spans     []simSpan
	streams   []simStream
	memEvents []memory.Event
	memTimes  []float64
	collBytes []float64 // per schedule op: the collective size modelled (0 for compute)
}

// OpTiming is one schedule op as the simulator ran it.
type OpTiming struct {
	StartS, EndS float64
	Bytes        float64 // the collective size modelled (0 for compute)
}

// OpTimings returns, for each op of r.Schedule in order, when it ran on the
// simulated rank and, for a collective, the bytes it was priced at (the
// most loaded rank's share for an all-to-all with recorded counts).
func (r *Result) OpTimings() []OpTiming {
	out := make([]OpTiming, len(r.spans))
	for i, sp := range r.spans {
		out[i] = OpTiming{StartS: sp.start, EndS: sp.end, Bytes: r.collBytes[i]}
	}
	return out
}

// simulated holds the per-op costs of a schedule.
type simulated struct {
	ops       []simOp
	recompute []float64 // recompute seconds inside each compute op
	comm      []CommCost
	bytes     []float64 // collectives: the size S modelled (after expert load)
	byClass   [][numOpClasses]float64
}

// Simulate predicts step time, TPS, MFU, HFU and memory of one layout by
// walking its schedule (BuildSchedule) in virtual time.
//
// Exactness: every rank runs the same program on groups of the same shape,
// so one rank is simulated and stands for all when routing is balanced
// (exact). With skew or recorded counts the ranks differ only between an
// MoE layer's dispatch and combine (their expert GEMMs) and in the
// all-to-all volumes; both all-to-alls are barriers of the EP group, so in
// each layer the group advances at the pace of its most loaded rank, and
// the simulated rank takes, layer by layer, the load of the rank receiving
// the most rows: exact as long as that rank is also the slowest through
// its grouped GEMMs. Group shapes are those of rank 0's groups; layouts
// whose groups straddle NVLink domains unevenly are approximated by
// rank 0's.
func Simulate(in Input) (Result, error) {
	p, err := prepareSim(in)
	if err != nil {
		return Result{}, err
	}
	return p.run(in.Calibration)
}

// simPrep is everything of a simulation that a calibration does not
// change: the schedule, the op counts, the memory timeline, the group
// shapes. Calibration evaluates one prepared run many times.
type simPrep struct {
	in     Input
	cfg    *moe.Config
	l      moe.Layout
	dev    hw.Device
	cl     *hw.Cluster
	mesh   *parallel.Mesh
	sched  *parallel.Schedule
	mem    memory.Report
	recs   []moe.OpRecord
	loads  map[int]expertShare // by MoE layer; absent = balanced
	exact  string
	convs  map[string]float64 // FLOPs per token by convention
	hwFLOP float64            // hardware FLOPs per token
	params float64            // parameters this rank's optimizer updates
	tokens float64            // per rank per step
}

func prepareSim(in Input) (*simPrep, error) {
	cfg := in.Config
	if cfg == nil {
		return nil, errors.New("simulate: no model config")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	if in.LBS < 1 || in.Seq < 1 {
		return nil, fmt.Errorf("simulate: lbs = %d, seq = %d: each must be ≥ 1", in.LBS, in.Seq)
	}
	if in.GradAccum == 0 {
		in.GradAccum = 1
	}
	if in.GradAccum < 0 || in.GradAccum > 1<<16 {
		return nil, fmt.Errorf("simulate: grad_accum = %d: must be in [1, 65536]", in.GradAccum)
	}
	if in.ExpertSkew != 0 && !(in.ExpertSkew >= 1) || math.IsInf(in.ExpertSkew, 0) {
		return nil, fmt.Errorf("simulate: expert skew = %v: must be ≥ 1 (0 = balanced)", in.ExpertSkew)
	}
	if n := len(in.ExpertCounts); n > 0 {
		if n != 1 && n != cfg.MoELayers() {
			return nil, fmt.Errorf("simulate: expert counts for %d layers; want 1 or one per MoE layer (%d)", n, cfg.MoELayers())
		}
		for i, row := range in.ExpertCounts {
			if len(row) != cfg.Experts {
				return nil, fmt.Errorf("simulate: expert counts row %d has %d entries for %d experts", i, len(row), cfg.Experts)
			}
			for _, c := range row {
				if c < 0 {
					return nil, fmt.Errorf("simulate: expert counts row %d: negative count %d", i, c)
				}
			}
		}
	}
	p := &simPrep{in: in, cfg: cfg, dev: in.Device}
	if p.dev.Name == "" {
		var err error
		if p.dev, err = hw.LookupDevice(hw.DefaultDeviceName); err != nil {
			return nil, err
		}
	}
	p.cl = in.Cluster
	if p.cl == nil {
		var err error
		if p.cl, err = hw.LoadCluster(hw.ClusterForGPU(p.dev.Name)); err != nil {
			return nil, err
		}
	}
	p.l = in.Layout
	if p.l.GPUsPerNode > 0 {
		c := p.cl.WithGPUsPerNode(p.l.GPUsPerNode)
		p.cl = &c
	}
	var err error
	if p.mesh, err = parallel.NewMesh(p.l, cfg, p.cl.GPUsPerNode); err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	if in.ExpertSkew > 1 {
		// A token sends one row to each expert it selects, so the EP rank
		// holding E/ep experts receives at most min(K, E/ep) rows per token,
		// of a mean of K/ep: the skew is at most ep·min(K, E/ep)/K (1
		// without EP or routed experts).
		maxSkew := 1.0
		if cfg.IsMoE() {
			maxSkew = float64(p.l.EP*min(cfg.TopK, cfg.Experts/p.l.EP)) / float64(cfg.TopK)
		}
		if in.ExpertSkew > maxSkew {
			return nil, fmt.Errorf("simulate: expert skew = %v: must be in [1, %v] for ep = %d, top-k %d of %d experts (the most loaded EP rank receives at most min(top-k, experts/ep) rows per token)",
				in.ExpertSkew, maxSkew, p.l.EP, cfg.TopK, cfg.Experts)
		}
	}
	if p.sched, err = parallel.BuildSchedule(parallel.ScheduleSpec{Config: cfg, Mesh: p.mesh, AC: in.AC, LBS: in.LBS, Seq: in.Seq, Micro: in.GradAccum}); err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	if p.mem, err = memory.Estimate(cfg, p.l, memory.Batch{LBS: in.LBS, Seq: in.Seq, GradAccum: in.GradAccum}, memory.Options{AC: in.AC}); err != nil {
		return nil, fmt.Errorf("simulate: memory: %w", err)
	}
	if p.recs, err = flops.Ops(cfg, flops.Shape{Seq: in.Seq, Batch: in.LBS}, in.AC, flops.DefaultTile); err != nil {
		return nil, fmt.Errorf("simulate: flops: %w", err)
	}
	if p.convs, p.hwFLOP, err = flopsPerToken(cfg, in); err != nil {
		return nil, err
	}
	p.loads, p.exact = expertLoads(cfg, p.l, in)
	p.params = float64(p.mem.State.Params / moe.DefaultPrecision.Param.Bytes())
	p.tokens = float64(in.LBS) * float64(in.Seq) * float64(in.GradAccum)
	return p, nil
}

// run simulates the prepared layout under a calibration (nil: defaults).
func (p *simPrep) run(cal *Calibration) (Result, error) {
	spec := ComputeSpecOf(p.dev).Calibrated(cal)
	if err := spec.Validate(); err != nil {
		return Result{}, fmt.Errorf("simulate: gpu %s: %w", p.dev.Name, err)
	}
	in := p.in
	in.Calibration = cal
	costs, err := opCosts(p.cfg, p.l, in, spec, p.recs, p.loads)
	if err != nil {
		return Result{}, err
	}
	optS := spec.MemorySeconds(p.params * bytesPerElement(moe.OpOptimizer, moe.Forward))
	sim, err := simOps(p.sched, p.cl, p.mesh, in, costs, optS, p.loads)
	if err != nil {
		return Result{}, err
	}
	spans, err := runEngine(sim.ops)
	if err != nil {
		return Result{}, err
	}
	res := Result{Device: p.dev.Name, Cluster: p.cl.Name, Schedule: p.sched, Exactness: p.exact, DeviceBytes: p.dev.MemoryBytes}
	for _, sp := range spans {
		res.StepTimeS = math.Max(res.StepTimeS, sp.end)
	}
	if !(res.StepTimeS > 0) {
		return Result{}, errors.New("simulate: zero step time")
	}
	res.Breakdown, res.Bottleneck = breakdown(p.sched, sim, spans, res.StepTimeS)
	res.TPS = p.tokens / res.StepTimeS
	res.MFUByConvention = map[string]float64{}
	for name, f := range p.convs {
		res.MFUByConvention[name] = f * res.TPS / p.dev.BF16FLOPs
	}
	res.MFU = res.MFUByConvention[string(flops.Torchtitan)]
	res.HFU = p.hwFLOP * res.TPS / p.dev.BF16FLOPs
	// Memory: replay the memory timeline (the one source of peak memory)
	// through the allocator model, calibrated when asked.
	alloc := memory.DefaultAllocator
	if cal != nil && cal.AllocatorOverhead > 0 {
		alloc.Fragmentation = cal.AllocatorOverhead
		alloc.Source = "calibrated"
	}
	peak, err := memory.Replay(p.mem.Events, alloc)
	if err != nil {
		return Result{}, fmt.Errorf("simulate: memory replay: %w", err)
	}
	res.PeakAllocatedBytes, res.PeakReservedBytes = peak.Allocated, peak.Reserved
	res.MemoryFraction = float64(peak.Reserved) / float64(p.dev.MemoryBytes)
	if in.KeepTimeline {
		res.spans = spans
		res.streams = make([]simStream, len(sim.ops))
		for i, o := range sim.ops {
			res.streams[i] = o.stream
		}
		res.collBytes = sim.bytes
		res.memEvents = p.mem.Events
		res.memTimes = memEventTimes(p.sched, spans, p.mem.Events)
	}
	return res, nil
}

// expertShare is the simulated rank's routed rows in one MoE layer
// relative to the balanced mean (T·K), and the relative sizes of its local
// expert groups (nil: even).
type expertShare struct {
	load   float64
	groups []float64
}

// expertLoads returns the simulated rank's share per MoE layer (absent:
// balanced) and the exactness statement.
func expertLoads(cfg *moe.Config, l moe.Layout, in Input) (map[int]expertShare, string) {
	const sym = "one rank simulated: all ranks run the same program on same-shaped groups with balanced routing"
	if !cfg.IsMoE() {
		return nil, sym
	}
	loads := map[int]expertShare{}
	local := cfg.Experts / l.EP
	if len(in.ExpertCounts) > 0 {
		k, worst := 0, 1.0
		for layer := 0; layer < cfg.Layers; layer++ {
			if !cfg.MoELayer[layer] {
				continue
			}
			row := in.ExpertCounts[min(k, len(in.ExpertCounts)-1)]
			k++
			var total int64
			for _, c := range row {
				total += c
			}
			best, bestRows := 0, int64(-1)
			for r := 0; r < l.EP; r++ {
				var rows int64
				for _, c := range row[r*local : (r+1)*local] {
					rows += c
				}
				if rows > bestRows {
					best, bestRows = r, rows
				}
			}
			w := make([]float64, local)
			for i, c := range row[best*local : (best+1)*local] {
				w[i] = float64(c)
			}
			sh := expertShare{load: 1, groups: w}
			if mean := float64(total) / float64(l.EP); mean > 0 {
				sh.load = float64(bestRows) / mean
			}
			worst = math.Max(worst, sh.load)
			loads[layer] = sh
		}
		return loads, fmt.Sprintf("one rank simulated: in each MoE layer the EP rank receiving the most rows under the given counts (up to %.3f× the mean); exact because every all-to-all waits for it", worst)
	}
	if in.ExpertSkew > 1 && l.EP > 1 {
		for layer := 0; layer < cfg.Layers; layer++ {
			if cfg.MoELayer[layer] {
				loads[layer] = expertShare{load: in.ExpertSkew}
			}
		}
		return loads, fmt.Sprintf("one rank simulated: the most loaded EP rank (%.3g× the mean rows); exact when it is the most loaded in every MoE layer", in.ExpertSkew)
	}
	return nil, sym
}

// segKey names one compute op of a schedule.
type segKey struct {
	layer int
	seg   parallel.Segment
	phase parallel.Phase
}

type segCost struct {
	total, recompute float64
	byClass          [numOpClasses]float64 // total split by op class
}

// opCosts sums modelled op times per (layer, segment, phase) for one
// micro-step of the simulated rank. Counts come from flops.Ops with a GPU
// flash-attention tile (flops.DefaultTile): the work the GPU executes.
func opCosts(cfg *moe.Config, l moe.Layout, in Input, spec ComputeSpec, recs []moe.OpRecord, loads map[int]expertShare) (map[segKey]segCost, error) {
	type opKey struct {
		layer int
		op    moe.Op
	}
	fwd := map[opKey]int64{}
	for _, r := range recs {
		if r.Pass == moe.Forward {
			fwd[opKey{r.Layer, r.Op}] = r.Count
		}
	}
	local := 1
	if cfg.IsMoE() {
		local = cfg.Experts / l.EP
	}
	costs := map[segKey]segCost{}
	var cls int
	addCost := func(k segKey, t, rec float64) {
		c := costs[k]
		c.total += t
		c.recompute += rec
		c.byClass[cls] += t
		costs[k] = c
	}
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
		t, err := spec.OpSeconds(cfg, r, local, groups)
		if err != nil {
			return nil, err
		}
		c, _ := OpClassOf(r.Op) // OpSeconds has checked it
		cls = int(c)
		switch r.Pass {
		case moe.Forward:
			addCost(segKey{r.Layer, seg, parallel.PhaseForward}, t, 0)
			if block && in.AC.FullyCheckpointed(r.Layer) {
				addCost(segKey{r.Layer, seg, parallel.PhaseRecompute}, t, t)
			}
		case moe.BackwardData, moe.BackwardWeight:
			addCost(segKey{r.Layer, seg, parallel.PhaseBackward}, t, 0)
		case moe.Recompute:
			if block && in.AC.FullyCheckpointed(r.Layer) {
				// The block's forward repeat is the PhaseRecompute op; what
				// the record holds beyond it (flash attention's own QKᵀ)
				// runs inside backward.
				extra := r.Count - fwd[opKey{r.Layer, r.Op}]
				if extra <= 0 {
					continue
				}
				r.Count = extra
				if t, err = spec.OpSeconds(cfg, r, local, groups); err != nil {
					return nil, err
				}
			}
			addCost(segKey{r.Layer, seg, parallel.PhaseBackward}, t, t)
		}
	}
	return costs, nil
}

// streamOf maps a schedule op to an engine stream.
func streamOf(o parallel.ScheduleOp, single bool) simStream {
	if o.Type == parallel.OpCompute {
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
	}
	return simReduce
}

// simOps turns the schedule into engine ops with modelled costs.
func simOps(s *parallel.Schedule, cl *hw.Cluster, mesh *parallel.Mesh, in Input, costs map[segKey]segCost, optS float64, loads map[int]expertShare) (*simulated, error) {
	sim := &simulated{ops: make([]simOp, len(s.Ops)), recompute: make([]float64, len(s.Ops)), comm: make([]CommCost, len(s.Ops)),
		bytes: make([]float64, len(s.Ops)), byClass: make([][numOpClasses]float64, len(s.Ops))}
	shapes := map[parallel.Axis]GroupShape{}
	for i, o := range s.Ops {
		so := simOp{stream: streamOf(o, in.SingleCommStream), deps: o.Deps}
		if o.Type == parallel.OpCompute {
			if o.Phase == parallel.PhaseOptimizer {
				so.compute = optS
			} else {
				c := costs[segKey{o.Layer, o.Segment, o.Phase}]
				so.compute = c.total
				sim.recompute[i] = c.recompute
				sim.byClass[i] = c.byClass
			}
			sim.ops[i] = so
			continue
		}
		g, ok := shapes[o.Axis]
		if !ok {
			g = ShapeOf(cl, mesh.Group(o.Axis, 0).Ranks)
			shapes[o.Axis] = g
		}
		bytes := float64(o.Bytes())
		if o.Coll == parallel.CollAllToAll && o.Purpose != parallel.PurposeCounts {
			if sh, ok := loads[o.Layer]; ok {
				bytes *= sh.load
			}
		}
		kind := parallel.CollKind(o.Coll)
		switch o.Coll {
		case parallel.CollBroadcast:
			kind = parallel.CollAllGather // a ring broadcast moves (n−1)/n·S per rank like an all-gather
		case parallel.CollBarrier:
			kind, bytes = parallel.CollAllReduce, 0
		}
		cc, err := CollectiveCost(cl, in.Calibration, kind, g, bytes)
		if err != nil {
			return nil, fmt.Errorf("simulate: op %d: %w", i, err)
		}
		if o.Coll == parallel.CollBarrier && g.Ranks > 1 {
			cc.LatencyS = cl.BaseLatencyUS * 1e-6
		}
		cc.Kind = parallel.CollKind(o.Coll)
		sim.comm[i] = cc
		sim.bytes[i] = bytes
		so.coll, so.lat, so.work, so.link = true, cc.LatencyS, cc.BandwidthS, cc.Link
		sim.ops[i] = so
	}
	return sim, nil
}

// breakdown charges the compute stream's time: busy spans to compute,
// recompute or optimizer (all-to-alls that run inline are exposed in
// full); idle gaps to the collectives in flight during the gap, in
// proportion to how long each overlaps it (a gap with none in flight is
// charged to "other"). The parts sum to the step time.
func breakdown(s *parallel.Schedule, sim *simulated, spans []simSpan, step float64) (Breakdown, string) {
	b := Breakdown{ExposedCommS: map[string]float64{}, CommS: map[string]float64{}, ComputeByClassS: map[string]float64{}}
	var order, colls []int
	for i, o := range sim.ops {
		if o.stream == simCompute {
			order = append(order, i)
		} else if o.coll {
			colls = append(colls, i)
		}
		if o.coll {
			b.CommS[string(sim.comm[i].Kind)] += spans[i].end - spans[i].start
		}
	}
	sort.SliceStable(order, func(a, c int) bool { return spans[order[a]].start < spans[order[c]].start })
	sort.SliceStable(colls, func(a, c int) bool { return spans[colls[a]].start < spans[colls[c]].start })
	// detail refines the exposed time by kind, axis and link class, to
	// name the bottleneck.
	detail := map[string]float64{}
	label := func(i int) string {
		return fmt.Sprintf("%s (%s, %s)", sim.comm[i].Kind, s.Ops[i].Axis, sim.comm[i].Link)
	}
	charge := func(from, to float64) {
		if to <= from {
			return
		}
		share := map[int]float64{}
		total := 0.0
		for _, i := range colls {
			if spans[i].start >= to {
				break
			}
			if ov := math.Min(to, spans[i].end) - math.Max(from, spans[i].start); ov > 0 {
				share[i] += ov
				total += ov
			}
		}
		if total == 0 {
			b.ExposedCommS["other"] += to - from
			detail["other"] += to - from
			return
		}
		for i, v := range share {
			b.ExposedCommS[string(sim.comm[i].Kind)] += (to - from) * v / total
			detail[label(i)] += (to - from) * v / total
		}
	}
	prevEnd := 0.0
	for _, i := range order {
		o := sim.ops[i]
		charge(prevEnd, spans[i].start)
		d := spans[i].end - spans[i].start
		switch {
		case o.coll:
			b.ExposedCommS[string(sim.comm[i].Kind)] += d
			detail[label(i)] += d
		case s.Ops[i].Phase == parallel.PhaseOptimizer:
			b.OptimizerS += d
		default:
			b.RecomputeS += sim.recompute[i]
			b.ComputeS += d - sim.recompute[i]
			if sim.byClass != nil {
				for c, v := range sim.byClass[i] {
					b.ComputeByClassS[OpClass(c).String()] += v
				}
			}
		}
		prevEnd = math.Max(prevEnd, spans[i].end)
	}
	// Collectives still running after the last compute op (ZeRO
	// re-gathers, trailing reductions).
	charge(prevEnd, step)
	// Bottleneck: compute (with recompute and optimizer) against each kind
	// of exposed communication; a communication bottleneck is named with
	// the axis and link class that expose most of it.
	name, top := "compute", b.ComputeS+b.RecomputeS+b.OptimizerS
	kinds := make([]string, 0, len(b.ExposedCommS))
	for k := range b.ExposedCommS {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		if v := b.ExposedCommS[k]; v > top {
			name, top = k, v
		}
	}
	if name == "compute" {
		return b, name
	}
	best, bestV := name, -1.0
	keys := make([]string, 0, len(detail))
	for k := range detail {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if strings.HasPrefix(k, name) && detail[k] > bestV {
			best, bestV = k, detail[k]
		}
	}
	return b, "exposed " + best
}

// memEventTimes stamps each memory-timeline event with the virtual time of
// the schedule op of the same micro-step, layer and phase (its start for an
// allocation, its end for a free); setup events at 0, optimizer events at
// the optimizer op.
func memEventTimes(s *parallel.Schedule, spans []simSpan, evs []memory.Event) []float64 {
	type key struct {
		micro, layer int
		phase        parallel.Phase
	}
	first := map[key]float64{}
	last := map[key]float64{}
	var optStart, optEnd float64
	for i, o := range s.Ops {
		if o.Type != parallel.OpCompute {
			continue
		}
		if o.Phase == parallel.PhaseOptimizer {
			optStart, optEnd = spans[i].start, spans[i].end
			continue
		}
		ph := o.Phase
		if ph == parallel.PhaseRecompute {
			ph = parallel.PhaseBackward
		}
		k := key{o.Micro, o.Layer, ph}
		if t, ok := first[k]; !ok || spans[i].start < t {
			first[k] = spans[i].start
		}
		last[k] = math.Max(last[k], spans[i].end)
	}
	out := make([]float64, len(evs))
	prev := 0.0
	for i, e := range evs {
		t := prev
		switch e.Phase {
		case memory.Setup:
			t = 0
		case memory.Optimizer:
			t = optStart
			if !e.Alloc {
				t = optEnd
			}
		default:
			ph := parallel.PhaseForward
			if e.Phase == memory.Backward {
				ph = parallel.PhaseBackward
			}
			k := key{e.Micro, e.Layer, ph}
			if v, ok := first[k]; ok {
				t = v
				if !e.Alloc {
					t = last[k]
				}
			}
		}
		t = math.Max(t, prev) // the timeline's order is kept
		out[i] = t
		prev = t
	}
	return out
}
