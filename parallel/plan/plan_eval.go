package plan

import (
	"fmt"
	"io"
	"sync"

	"github.com/moescope/moescope/internal/band"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// SimEvaluator is the planner's real evaluator: peak memory from the memory
// package's step timeline and allocator model, step time, TPS and MFU from
// the virtual-time backend. It holds no mutable state, so the planner's
// goroutines share it.
type SimEvaluator struct {
	// Run is the run every point is applied to (Spec): its model, its
	// sequence length and its recipe; the layout, checkpointing, local
	// batch and accumulation are each point's.
	Run         job.Spec
	Device      hw.Device
	Cluster     *hw.Cluster
	Calibration *cost.Calibration // nil: uncalibrated defaults

	// Results are cached per point: the search asks for some points more
	// than once (sizing, stages, sweeps).
	mu     sync.Mutex
	mems   map[Point]float64
	scores map[Point]Score
	floors map[Point]float64 // MemoryFloor by layout
}

func (e *SimEvaluator) cachedMemory(p Point) (float64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m, ok := e.mems[p]
	return m, ok
}

func (e *SimEvaluator) cachedScore(p Point) (Score, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, ok := e.scores[p]
	return s, ok
}

func (e *SimEvaluator) store(p Point, m *float64, s *Score) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if m != nil {
		if e.mems == nil {
			e.mems = map[Point]float64{}
		}
		e.mems[p] = *m
	}
	if s != nil {
		if e.scores == nil {
			e.scores = map[Point]Score{}
		}
		e.scores[p] = *s
	}
}

// Spec is the evaluator's run with p's searched part applied: the one
// description of p that memory and the simulator read.
func (e *SimEvaluator) Spec(p Point) job.Spec {
	s := e.Run
	s.Layout, s.AC, s.LBS, s.GradAccum = p.Layout, p.AC, p.LBS, p.GradAccum
	// A stated expert skew is the most loaded expert-parallel rank's; a
	// layout with fewer EP ranks cannot be that uneven and is priced at
	// its own bound (balanced without expert parallelism).
	s.ExpertSkew = min(s.ExpertSkew, max(s.MaxExpertSkew(), 1))
	return s
}

// allocator is the allocator model under the evaluator's calibration.
func (e *SimEvaluator) allocator() *memory.Allocator {
	a := e.Calibration.Allocator(memory.DefaultAllocator)
	return &a
}

// MemoryFraction is peak reserved bytes / device memory (as PyTorch reports it).
func (e *SimEvaluator) MemoryFraction(p Point) (float64, error) {
	if e.Device.MemoryBytes <= 0 {
		return 0, fmt.Errorf("device %q: memory_bytes = %d", e.Device.Name, e.Device.MemoryBytes)
	}
	key := memoryKey(p)
	if m, ok := e.cachedMemory(key); ok {
		return m, nil
	}
	r, err := memory.EstimateRun(e.Spec(key), e.allocator())
	if err != nil {
		return 0, err
	}
	m := float64(r.Peak.Reserved) / float64(e.Device.MemoryBytes)
	e.store(key, &m, nil)
	return m, nil
}

// MemoryFloor is memory.SetupBytes of p's layout over the device's memory:
// no local batch of it needs less (the planner skips a layout whose state
// alone exceeds the target). Shared like MemoryFraction, per memory key
// without the batch.
func (e *SimEvaluator) MemoryFloor(p Point) (float64, error) {
	if e.Device.MemoryBytes <= 0 {
		return 0, fmt.Errorf("device %q: memory_bytes = %d", e.Device.Name, e.Device.MemoryBytes)
	}
	key := Point{Layout: memoryKey(p).Layout}
	e.mu.Lock()
	f, ok := e.floors[key]
	e.mu.Unlock()
	if ok {
		return f, nil
	}
	o := memory.OptionsOf(e.Run.Recipe, p.AC)
	o.Allocator = e.allocator()
	b, err := memory.SetupBytes(e.Run.Model, key.Layout, o)
	if err != nil {
		return 0, err
	}
	f = float64(b) / float64(e.Device.MemoryBytes)
	e.mu.Lock()
	if e.floors == nil {
		e.floors = map[Point]float64{}
	}
	e.floors[key] = f
	e.mu.Unlock()
	return f, nil
}

// MemoryReport is the memory package's report of p as the evaluator models
// it (p's AC, the calibrated allocator overhead); its Events are the step's
// allocation timeline, which a report plots for the best plan.
func (e *SimEvaluator) MemoryReport(p Point) (memory.Report, error) {
	l := p.Layout
	if l.GPUsPerNode == 0 && e.Cluster != nil {
		l.GPUsPerNode = e.Cluster.GPUsPerNode
	}
	s := e.Spec(p)
	s.Layout = l
	return memory.EstimateRun(s, e.allocator())
}

// memoryKey is p with what a rank's memory does not depend on made
// canonical, so that layouts giving a rank the same shapes share one
// estimate: the replica count (one replica) and the host size (memory
// reads neither; memory.Estimate uses dp_replicate only for the partial
// reduce buffer of allreduce-last-only with accumulation, kept).
func memoryKey(p Point) Point {
	l := p.Layout
	l.GPUsPerNode = 0
	if !(l.AllreduceLastOnly && l.DPReplicate > 1 && p.GradAccum > 1) {
		l.GPUs, l.DPReplicate = l.Stages()*l.DPShard*l.CPDegree()*l.TPDegree(), 1
	}
	p.Layout = l
	return p
}

// input is the simulator's input for p.
func (e *SimEvaluator) input(p Point) sim.Input {
	return sim.Input{Spec: e.Spec(p), Device: e.Device, Cluster: e.Cluster, Calibration: e.Calibration}
}

// Evaluate simulates p on the virtual-time backend.
func (e *SimEvaluator) Evaluate(p Point) (Score, error) {
	if s, ok := e.cachedScore(p); ok {
		return s, nil
	}
	in := e.input(p)
	in.SkipInterval = true
	r, err := sim.Simulate(in)
	if err != nil {
		return Score{}, err
	}
	s := Score{TPS: r.TPS, MFU: r.MFU, MemoryFraction: r.MemoryFraction, DoesNotFit: !r.Fits, StepTimeS: r.StepTimeS,
		Bottleneck: r.Bottleneck, Breakdown: r.Breakdown}
	e.store(p, nil, &s)
	return s, nil
}

// Interval is the 90% interval of the TPS of p, scored s: the
// calibration's posterior (sim.Simulate) when it carries one, else the
// model's uncalibrated band around s.TPS (internal/band).
func (e *SimEvaluator) Interval(p Point, s Score) (*[2]float64, error) {
	if e.Calibration != nil {
		r, err := sim.Simulate(e.input(p))
		if err != nil {
			return nil, err
		}
		if r.IntervalFrom == sim.IntervalCalibration {
			return r.TPSInterval, nil
		}
	}
	iv := band.Uncalibrated().TPS.Of(s.TPS)
	return &iv, nil
}

// Intervals fills the TPS interval (Interval) of rep's best plan and of
// its first top plans, the ones a caller reports, and marks those whose
// interval reaches the best's (Score.Indistinguishable). The search
// ranks by the central value and skips intervals.
func (e *SimEvaluator) Intervals(rep *Report, top int) error {
	rep.Calibrated = e.Calibration != nil
	var err error
	if rep.Best.Score.TPSInterval, err = e.Interval(rep.Best.Point, rep.Best.Score); err != nil {
		return err
	}
	low := rep.Best.Score.TPSInterval[0]
	for i := range rep.Plans[:min(top, len(rep.Plans))] {
		r := &rep.Plans[i]
		if r.Score.TPSInterval, err = e.Interval(r.Point, r.Score); err != nil {
			return err
		}
		r.Score.Indistinguishable = r.Point != rep.Best.Point && r.Score.TPSInterval[1] >= low
	}
	return nil
}

// Trace simulates p keeping its timeline and writes the step as a Chrome
// trace (rank 0; every rank runs the same program, see Simulate).
func (e *SimEvaluator) Trace(w io.Writer, p Point) error {
	in := e.input(p)
	in.KeepTimeline = true
	r, err := sim.Simulate(in)
	if err != nil {
		return err
	}
	return r.WriteTrace(w, []int{0})
}
