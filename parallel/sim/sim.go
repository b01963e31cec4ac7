package sim

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/internal/band"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/memory/verdict"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/epbuffer"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// Input is one run to predict (job.Spec: model, layout, batch,
// checkpointing and recipe), the hardware it runs on, an optional
// calibration and the simulator's own options.
type Input struct {
	// Spec is the run; its Layout is resolved (job.Layout.Resolve), its
	// GPUsPerNode 0 = the cluster's. Build its Recipe from
	// job.DefaultRecipe (or EagerRecipe): its booleans have no empty
	// value (a zero Recipe is eager with fixed segments); its empty
	// strings are filled with the defaults (job.Recipe.Resolve).
	job.Spec
	Device hw.Device
	// Cluster describes hosts and links; nil means ClusterForGPU(Device.Name).
	Cluster     *hw.Cluster
	Calibration *cost.Calibration
	// ExpertCounts, when set, are the rows each routed expert receives in
	// one micro-step from one EP group, as a numeric run records them: one
	// row of len = experts per MoE layer in layer order, or a single row
	// used for every MoE layer; every micro-step uses the same counts.
	// They override the recipe's ExpertSkew.
	ExpertCounts [][]int64
	// SingleCommStream runs the schedule's communication stream as one
	// stream (no FSDP2 side streams; all-to-alls stay on it).
	SingleCommStream bool
	// KeepTimeline keeps per-op spans for traces.
	KeepTimeline bool
	// MemoryTarget is the fraction of device memory the verdict's
	// WithinTarget allows; 0 means verdict.DefaultMemoryTarget.
	MemoryTarget float64
	// Allocator is the caching allocator's model (nil:
	// memory.DefaultAllocator); a calibration's overhead replaces its
	// fragmentation (cost.Calibration.Allocator).
	Allocator *memory.Allocator
	// SkipInterval leaves out the calibrated TPS interval, which costs one
	// more simulation per fitted parameter (a search computes it for the
	// plans it reports only).
	SkipInterval bool
	// cp is the K/V exchange of a context-parallel run, whose Spec
	// Prepare folds (cp.go); zero without CP.
	cp cpExchange
}

// Result is the prediction for one layout.
type Result struct {
	Device  string `json:"gpu"`
	Cluster string `json:"cluster"`
	// StepTimeS is one optimizer step (all micro-steps), seconds.
	StepTimeS float64 `json:"step_time_s"`
	// TPS is a rank's own tokens per second (torchtitan's definition).
	TPS float64 `json:"tps"`
	// Calibrated says a calibration priced the run. TPSInterval,
	// MFUInterval and StepTimeInterval are 90% intervals [low, high]
	// (DESIGN's Uncertainty contract): from the calibration's posterior
	// when it carries the fit's covariance (unless Input.SkipInterval),
	// else the model's uncalibrated band over the published runs
	// (internal/band), which is wider.
	Calibrated       bool        `json:"calibrated"`
	TPSInterval      *[2]float64 `json:"tps_interval,omitempty"`
	MFUInterval      *[2]float64 `json:"mfu_interval,omitempty"`
	StepTimeInterval *[2]float64 `json:"step_time_interval,omitempty"`
	// IntervalFrom says which: IntervalCalibration or IntervalBand.
	IntervalFrom string `json:"interval_from,omitempty"`
	// MFU uses the torchtitan FLOP convention; MFUByConvention holds every
	// convention flops knows; HFU the hardware count (recompute included).
	MFU             float64            `json:"mfu"`
	HFU             float64            `json:"hfu"`
	MFUByConvention map[string]float64 `json:"mfu_by_convention"`
	// MFUFP8Peak is the torchtitan-convention MFU against the dense peak
	// of the recipe's low-precision type (FP8, or MXFP8 for mxfp8) rather
	// than BF16's (DESIGN: MFU stays against BF16; FP8 runs also report
	// this); absent for bf16 runs.
	MFUFP8Peak *float64 `json:"mfu_fp8_peak,omitempty"`
	// MFUFP4Peak is the same against the dense FP4 peak, for an FP4 recipe
	// (nvfp4) instead of MFUFP8Peak.
	MFUFP4Peak *float64 `json:"mfu_fp4_peak,omitempty"`
	// Memory: the memory package's step timeline replayed through its
	// allocator model (the calibrated one when a calibration sets it).
	PeakAllocatedBytes int64   `json:"peak_allocated_bytes"`
	PeakReservedBytes  int64   `json:"peak_reserved_bytes"`
	DeviceBytes        int64   `json:"device_bytes"`
	MemoryFraction     float64 `json:"memory_fraction"`
	// Fit says whether the layout fits the device and its memory target
	// (JSON fits, headroom_bytes, within_target).
	verdict.Fit
	Breakdown Breakdown `json:"breakdown"`
	// Bottleneck names the largest part of the breakdown.
	Bottleneck string `json:"bottleneck"`
	// Exactness says which ranks were simulated and why that is exact.
	Exactness string `json:"exactness"`
	// Pipeline is the per-stage timing under pipeline parallelism (pp >
	// 1; pipeline.go), absent otherwise. Schedule is nil then: each
	// pipeline rank runs its own program.
	Pipeline *PipelineTiming `json:"pipeline,omitempty"`
	pipe     *pipeWalk
	// TPLink is the link class the tensor-parallel collectives run on:
	// "nvlink" when the tp group lies in one NVLink domain, "network" when
	// it spans domains; absent without tp.
	TPLink string `json:"tp_link,omitempty"`
	// CPLink is the link class of the cp group's K/V exchange (its
	// slowest hop); absent without cp.
	CPLink string `json:"cp_link,omitempty"`

	Schedule  *parallel.Schedule `json:"-"`
	spans     []simSpan
	streams   []simStream
	memEvents []memory.Event
	memTimes  []float64
	collBytes []float64 // per schedule op: the collective size modelled (0 for compute)
}

// setMFU sets the MFUs and HFU of r.TPS on dev from the FLOPs per token by
// convention and the hardware count: against the BF16 dense peak, and for
// a low-precision recipe the torchtitan convention also against its own.
func (r *Result) setMFU(dev hw.Device, p job.Precision, convs map[string]float64, hwFLOP float64) {
	r.MFUByConvention = map[string]float64{}
	for name, f := range convs {
		r.MFUByConvention[name] = f * r.TPS / dev.BF16FLOPs
	}
	r.MFU = r.MFUByConvention[string(flops.Torchtitan)]
	r.HFU = hwFLOP * r.TPS / dev.BF16FLOPs
	if p.LowPrecision() {
		peak, at := dev.FP8FLOPs, &r.MFUFP8Peak
		switch {
		case p.Microscaled():
			peak = dev.MXFP8FLOPs
		case p.FP4():
			peak, at = dev.FP4FLOPs, &r.MFUFP4Peak
		}
		m := convs[string(flops.Torchtitan)] * r.TPS / peak
		*at = &m
	}
}

// Where a result's intervals come from (Result.IntervalFrom).
const (
	IntervalCalibration = "calibration's fit"
	IntervalBand        = "uncalibrated: the published runs' errors"
)

// setIntervals sets the TPS interval tps and the MFU and step-time
// intervals it implies (MFU ∝ TPS, step time ∝ 1/TPS), from source.
func (r *Result) setIntervals(tps [2]float64, source string) {
	m := [2]float64{r.MFU * tps[0] / r.TPS, r.MFU * tps[1] / r.TPS}
	st := [2]float64{r.StepTimeS * r.TPS / tps[1], r.StepTimeS * r.TPS / tps[0]}
	r.TPSInterval, r.MFUInterval, r.StepTimeInterval, r.IntervalFrom = &tps, &m, &st, source
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
	res, err := simulate(in)
	if err != nil {
		return res, err
	}
	return widenForRouter(in, res)
}

// simulate is Simulate without the learned router's spread.
func simulate(in Input) (Result, error) {
	if err := in.Recipe.Resolve(); err != nil {
		return Result{}, fmt.Errorf("simulate: %w", err)
	}
	if in.Layout.Stages() > 1 {
		if f := in.Routing.File(); f != "" && len(in.ExpertCounts) == 0 {
			var err error
			if in.ExpertCounts, err = RoutingCounts(f, in.Model); err != nil {
				return Result{}, err
			}
		}
		return simulatePipeline(in)
	}
	p, err := Prepare(in)
	if err != nil {
		return Result{}, err
	}
	res, err := p.Run(in.Calibration)
	if err != nil || in.SkipInterval {
		return res, err
	}
	iv, err := p.tpsInterval(in.Calibration, res)
	if iv != nil {
		res.setIntervals(*iv, IntervalCalibration)
	}
	return res, err
}

// Prepared is everything of a simulation that a calibration does not
// change: the schedule, the op counts, the memory timeline, the group
// shapes. Calibration evaluates one prepared run many times (Run); a
// layout without pipeline parallelism only (Simulate walks pipelines).
type Prepared struct {
	in     Input
	cfg    *moe.Config
	local  *moe.Config // cfg as one tp rank holds it (tpLocal); cfg without tp
	l      job.Layout
	dev    hw.Device
	cl     *hw.Cluster
	mesh   *parallel.Mesh
	tpG    cost.GroupShape // the tp collectives' group (widestTPGroup)
	sched  *parallel.Schedule
	mem    memory.Report
	recs   []moe.OpRecord
	loads  map[int]expertShare // by MoE layer; absent = balanced
	exact  string
	convs  map[string]float64 // FLOPs per token by convention
	hwFLOP float64            // hardware FLOPs per token
	params float64            // parameters this rank's optimizer updates
	// peaks caches the memory replay by allocator with its Fragmentation
	// zeroed: a calibration's trials change only that fraction, and the
	// replay is most of a simulation's time.
	peaksMu sync.Mutex
	peaks   map[memory.Allocator]memory.Peak
	tokens  float64 // per rank per step
}

// Prepare checks in, resolves its device and cluster and builds what
// every run of it shares (Prepared). Simulate of a layout with pp = 1 is
// Prepare, then Run under in.Calibration, then the TPS interval.
func Prepare(in Input) (*Prepared, error) {
	if in.GradAccum == 0 {
		in.GradAccum = 1
	}
	if err := in.Recipe.Resolve(); err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	if err := checkInput(in); err != nil {
		return nil, err
	}
	cfg := in.Model
	if f := in.Routing.File(); f != "" && len(in.ExpertCounts) == 0 {
		var err error
		if in.ExpertCounts, err = RoutingCounts(f, cfg); err != nil {
			return nil, err
		}
	}
	p := &Prepared{in: in, cfg: cfg}
	var err error
	if p.dev, p.cl, err = resolveHardware(in); err != nil {
		return nil, err
	}
	// Under CP the rank runs the folded spec (cp.go); memory, the model's
	// FLOPs per token and attention's records keep the whole sequence.
	orig := in
	if in, err = cpFold(in, p.cl); err != nil {
		return nil, err
	}
	p.in = in
	p.l = in.Layout
	if err := checkAsyncTP(in); err != nil {
		return nil, err
	}
	if err := checkKnobs(in); err != nil {
		return nil, err
	}
	if p.mesh, err = parallel.NewMesh(p.l, cfg, p.cl.GPUsPerNode); err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	if err := checkSkewBound(in.Spec); err != nil {
		return nil, err
	}
	// The schedule's collectives move the run's own types (bf16 or fp32
	// parameters, its reduce dtype), as its memory timeline holds them.
	if p.sched, err = parallel.BuildSchedule(parallel.ScheduleSpec{Spec: in.Spec, Mesh: p.mesh, NoMemory: true}); err != nil { // p.mem below is the timeline, under in's memory options
		return nil, fmt.Errorf("simulate: %w", err)
	}
	if p.mem, err = memory.EstimateRun(memorySpec(orig.Spec, in.ExpertCounts), in.Allocator); err != nil {
		return nil, fmt.Errorf("simulate: memory: %w", err)
	}
	// Estimate replayed the timeline through this allocator already: seed
	// the cache so run does not replay it again.
	key := memory.DefaultAllocator
	if in.Allocator != nil {
		key = *in.Allocator
	}
	key.Fragmentation = 0
	p.peaks = map[memory.Allocator]memory.Peak{key: p.mem.Peak}
	if p.recs, err = cpOps(orig.Spec, in.Spec); err != nil {
		return nil, fmt.Errorf("simulate: flops: %w", err)
	}
	if p.local, err = tpLocal(cfg, p.l); err != nil {
		return nil, err
	}
	if p.convs, p.hwFLOP, err = flopsPerToken(cfg, orig); err != nil {
		return nil, err
	}
	p.loads, p.exact = expertLoads(cfg, p.l, in)
	p.tpG = widestTPGroup(p.cl, p.mesh)
	if w := p.tpG; p.l.TPDegree() > 1 && w != cost.ShapeOf(p.cl, p.mesh.Group(parallel.AxisTP, 0).Ranks) {
		p.exact = fmt.Sprintf("tp %d does not divide the NVLink domain of %d, so some tp groups span %d domains: their collectives, which block the step, are priced for every rank; otherwise ",
			p.l.TPDegree(), p.cl.NVLinkDomain, w.Domains) + p.exact
	}
	p.params = float64(p.mem.State.Params / in.ParamDType.Bytes())
	// A rank's own tokens (torchtitan's TPS divides by cp·tp·pp): the tp
	// ranks of a group share their data-parallel rank's micro-batches (a
	// cp rank's sequences are seq/cp long).
	p.tokens = float64(in.LBS) * float64(in.Seq) * float64(in.GradAccum) / float64(p.l.TPDegree())
	return p, nil
}

// checkInput checks the fields of in that need no hardware: the model, the
// batch, the grad accumulation (already defaulted) and the routing skew or
// counts.
func checkInput(in Input) error {
	cfg := in.Model
	if cfg == nil {
		return errors.New("simulate: no model config")
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	if err := in.Precision.Check("precision"); err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	if err := in.Batch.Validate(); err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	if in.MemoryTarget != 0 && !(in.MemoryTarget > 0 && in.MemoryTarget <= 1) {
		return fmt.Errorf("simulate: memory_target = %v: must be in (0, 1] (0 = %g)", in.MemoryTarget, verdict.DefaultMemoryTarget)
	}
	if len(in.ExpertCounts) > 0 {
		if err := checkExpertCounts(in.ExpertCounts, cfg); err != nil {
			return fmt.Errorf("simulate: %w", err)
		}
	}
	return nil
}

// resolveHardware returns in's device (hw.DefaultDeviceName when unnamed)
// and cluster (the device's usual one when nil), the cluster resized when
// the layout sets GPUs per node.
func resolveHardware(in Input) (hw.Device, *hw.Cluster, error) {
	dev := in.Device
	if dev.Name == "" {
		var err error
		if dev, err = hw.LookupDevice(hw.DefaultDeviceName); err != nil {
			return hw.Device{}, nil, err
		}
	}
	cl := in.Cluster
	if cl == nil {
		var err error
		if cl, err = hw.LoadCluster(hw.ClusterForGPU(dev.Name)); err != nil {
			return hw.Device{}, nil, err
		}
	}
	if in.Layout.GPUsPerNode > 0 {
		c := cl.WithGPUsPerNode(in.Layout.GPUsPerNode)
		cl = &c
	}
	return dev, cl, nil
}

// checkSkewBound checks the run's expert skew against the most it can be
// on its layout (job.Spec.MaxExpertSkew; under pp, the stage's layout).
func checkSkewBound(s job.Spec) error {
	if err := s.CheckExpertSkew(); err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	return nil
}

// Run simulates the prepared layout under a calibration (nil: defaults),
// without the TPS interval. Runs of one Prepared may go concurrently.
func (p *Prepared) Run(cal *cost.Calibration) (Result, error) {
	st, err := p.step(cal, true)
	if err != nil {
		return Result{}, err
	}
	in, sim, spans := st.in, st.sim, st.spans
	sim.over[ohNCCLContention] = contention(sim, spans)
	res := Result{Device: p.dev.Name, Cluster: p.cl.Name, Schedule: p.sched, Exactness: p.exact, DeviceBytes: p.dev.MemoryBytes, StepTimeS: st.seconds}
	for i, o := range p.sched.Ops {
		if o.Type == parallel.OpCollective && o.Axis == parallel.AxisTP {
			res.TPLink = sim.comm[i].Link.String()
			break
		}
	}
	if p.in.cp.cp > 1 {
		res.CPLink = p.in.cp.link.String()
	}
	res.Breakdown, res.Bottleneck = breakdown(p.sched, sim, spans, res.StepTimeS)
	res.Breakdown.OverheadS = map[string]float64{}
	for i, name := range overheadNames {
		if i != int(ohGraphSaved) || in.CUDAGraphs.Captures(true) {
			res.Breakdown.OverheadS[name] = sim.over[i]
		}
	}
	res.TPS = p.tokens / res.StepTimeS
	res.setMFU(p.dev, in.Precision, p.convs, p.hwFLOP)
	res.Calibrated = cal != nil
	res.setIntervals(band.Uncalibrated().TPS.Of(res.TPS), IntervalBand)
	// Memory: replay the memory timeline (the one source of peak memory)
	// through the allocator model, calibrated when asked.
	alloc := memory.DefaultAllocator
	if in.Allocator != nil {
		alloc = *in.Allocator
	}
	peak, err := p.replay(cal.Allocator(alloc))
	if err != nil {
		return Result{}, fmt.Errorf("simulate: memory replay: %w", err)
	}
	res.PeakAllocatedBytes, res.PeakReservedBytes = peak.Allocated, peak.Reserved
	res.MemoryFraction = float64(peak.Reserved) / float64(p.dev.MemoryBytes)
	target := in.MemoryTarget
	if target == 0 {
		target = verdict.DefaultMemoryTarget
	}
	es := in.Spec
	es.Layout, es.Model = p.l, p.in.Model
	outside, err := epbuffer.Outside(p.dev, es, p.cl.NVLinkDomain)
	if err != nil {
		return Result{}, fmt.Errorf("simulate: %w", err)
	}
	res.Fit = verdict.Judge(peak.Reserved, outside, p.dev.MemoryBytes, target)
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

// MemoryOptions is the memory model's view of the run
// (memory.OptionsOf) under the input's allocator model, at the load of
// the rank recorded counts load most (memorySpec).
func (in Input) MemoryOptions() memory.Options {
	o := memory.OptionsOf(memorySpec(in.Spec, in.ExpertCounts).Recipe, in.AC)
	o.Allocator = in.Allocator
	return o
}

// compiledModel says whether torch.compile compiles the blocks.
func (in Input) compiledModel() bool {
	model, _ := in.Compiled()
	return model
}

// Input is the prepared input, its grad accumulation defaulted to 1.
func (p *Prepared) Input() Input { return p.in }

// Device is the GPU the run is priced on: the input's, or
// hw.DefaultDeviceName's when it names none.
func (p *Prepared) Device() hw.Device { return p.dev }

// Cluster is the cluster the run is priced on: the input's, or the
// device's usual one, resized when the layout sets GPUs per node.
func (p *Prepared) Cluster() *hw.Cluster { return p.cl }

// Memory is the step's memory report (memory.Estimate under the input's
// memory options), whose timeline Run replays.
func (p *Prepared) Memory() memory.Report { return p.mem }

// FLOPsPerToken is the model FLOPs per token by convention c (each
// convention flops knows, as Result.MFUByConvention).
func (p *Prepared) FLOPsPerToken(c flops.Convention) float64 { return p.convs[string(c)] }

// TPS is Run's TPS alone: the step on the engine, without the breakdown,
// the memory and the verdicts Run adds to it (a fit reads only TPS).
func (p *Prepared) TPS(cal *cost.Calibration) (float64, error) {
	st, err := p.step(cal, false)
	if err != nil {
		return 0, err
	}
	return p.tokens / st.seconds, nil
}

// engineStep is one step of the prepared layout on the engine: the input
// it ran under, its priced ops, their spans and the step time.
type engineStep struct {
	in      Input
	sim     *simulated
	spans   []simSpan
	seconds float64
}

// step prices the schedule under cal and runs it on the engine; detail
// keeps what Run's breakdown reads (simOps).
func (p *Prepared) step(cal *cost.Calibration, detail bool) (engineStep, error) {
	spec, err := computeSpec(p.dev, p.in, cal)
	if err != nil {
		return engineStep{}, err
	}
	waitsFor(&spec, p.l, p.cl)
	if err := spec.Validate(); err != nil {
		return engineStep{}, fmt.Errorf("simulate: gpu %s: %w", p.dev.Name, err)
	}
	in := p.in
	in.Calibration = cal
	costs, err := opCosts(p.local, p.l, in, spec, p.recs, p.loads)
	if err != nil {
		return engineStep{}, err
	}
	opt, err := p.optimizerCost(spec, cal)
	if err != nil {
		return engineStep{}, err
	}
	sim, err := simOps(p.sched, p.cl, p.mesh, p.tpG, in, spec, costs, opt, p.loads, detail)
	if err != nil {
		return engineStep{}, err
	}
	rate := float64(spec.SMs-spec.NCCLCTAs) / float64(spec.SMs)
	spans, err := runEngineShared(sim.ops, rate)
	if err != nil {
		return engineStep{}, err
	}
	st := engineStep{in: in, sim: sim, spans: spans}
	for _, sp := range spans {
		st.seconds = math.Max(st.seconds, sp.end)
	}
	if !(st.seconds > 0) {
		return engineStep{}, errors.New("simulate: zero step time")
	}
	return st, nil
}

// replay is memory.Replay of the prepared timeline under a, from the cache
// when only a's Fragmentation differs from an earlier replay.
func (p *Prepared) replay(a memory.Allocator) (memory.Peak, error) {
	key := a
	key.Fragmentation = 0
	p.peaksMu.Lock()
	defer p.peaksMu.Unlock()
	peak, ok := p.peaks[key]
	if !ok {
		var err error
		if peak, err = memory.Replay(p.mem.Events, key, p.in.MemoryOptions().Segments); err != nil {
			return memory.Peak{}, err
		}
		if p.peaks == nil {
			p.peaks = map[memory.Allocator]memory.Peak{}
		}
		p.peaks[key] = peak
	}
	peak.Reserved = peak.ReservedWith(a.Fragmentation)
	return peak, nil
}
