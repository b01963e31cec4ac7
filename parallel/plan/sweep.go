package plan

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/internal/band"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// A calibration sweep is the seed study's first step made explicit: the
// few small runs whose measured TPS best pin down the simulator's
// calibration. Candidates are the smallest stage of the plan's search
// (every checkpointing policy's best family, at local batches spanning its
// memory-limited sweep) and the same families grown to two hosts, where
// traffic crosses the network. Each candidate's sensitivity
//
//	s_j = ∂ ln TPS / ∂ ln θ_j
//
// to every TPS calibration parameter θ_j is a finite difference through
// the simulator (θ_j multiplied by exp(sim.SensitivityStep), as calibrate
// probes). Measured with relative noise σ (cost.RunTPSNoise, the noise
// model calibrate fits with), a set of runs informs the
// log-parameters by F = Σ_runs s sᵀ / σ² (plus a unit prior that keeps F
// invertible): jobs are picked greedily by the largest gain in log det F
// (a D-optimal design), starting from the predicted optimum and the best
// two-host run. A parameter counts as identified by calibrate's own rule
// (calib.IdentifiedParams on the chosen jobs' sensitivities), so a sweep
// promises exactly the parameters calibrate will fit from its runs; the
// posterior standard deviation √(F⁻¹)_jj says how tightly.

// SweepParams are the calibration parameters TPS depends on, in
// calib.Calibrate's order.
var SweepParams = cost.TPSParams

// SweepJob is one run of a sweep, with its prediction and why it is there.
type SweepJob struct {
	Result
	// Sensitivity is ∂ ln TPS / ∂ ln θ per parameter of SweepParams.
	Sensitivity map[string]float64
	Why         string
}

// ParamStatus says how well a sweep pins one parameter.
type ParamStatus struct {
	Name string
	// Std is the posterior standard deviation of ln θ after the sweep
	// (cost.RunTPSNoise per run, unit prior): 1 means the runs say nothing.
	Std float64
	// Identified says calibrate will fit it from the sweep's runs
	// (calib.IdentifiedParams).
	Identified bool
}

// SweepDesign is a calibration sweep.
type SweepDesign struct {
	Scale, TwoHost int // GPUs of the smallest stage and of the two-host runs
	Jobs           []SweepJob
	Params         []ParamStatus
	Candidates     int // points whose sensitivities were computed
}

// DesignSweep picks up to maxJobs runs (at least 3 when that many
// candidates exist) for the request's smallest scale on ev.
func DesignSweep(req Request, ev *SimEvaluator, maxJobs int) (*SweepDesign, error) {
	if maxJobs < 3 {
		return nil, fmt.Errorf("sweep: max jobs = %d: must be ≥ 3", maxJobs)
	}
	q, err := req.withDefaults()
	if err != nil {
		return nil, err
	}
	if s := band.Uncalibrated().NodeSpread; ev.Calibration == nil && s > 0 {
		// Plan the runs as calibrate will model them: with the stored
		// spread between nodes, which sim prices under a calibration only.
		ev = &SimEvaluator{Run: ev.Run, Device: ev.Device, Cluster: ev.Cluster, Calibration: &cost.Calibration{NodeSpread: &s}}
	}
	d := &SweepDesign{Scale: q.probeScales(ev)[0], TwoHost: 2 * q.GPUsPerNode}
	stage := req
	stage.GPUs, stage.GlobalBatch, stage.Exhaustive = d.Scale, 0, false
	rep, err := Search(stage, ev)
	if err != nil {
		return nil, err
	}
	cands := sweepCandidates(rep)
	if d.TwoHost > d.Scale {
		cands = append(cands, q.twoHost(ev, rep, d.TwoHost)...)
	} else {
		d.TwoHost = d.Scale
	}
	jobs, err := sensitivities(ev, cands)
	if err != nil {
		return nil, err
	}
	d.Candidates = len(jobs)
	d.Jobs = pickJobs(jobs, maxJobs, rep.Best.Point, d.TwoHost)
	d.Params = paramStatus(d.Jobs)
	return d, nil
}

// sweepCandidates are, for each checkpointing policy's best family at the
// smallest stage, its best local batch, the smallest, and those near a
// quarter and a half of the best (the sweep's span around the optimum).
func sweepCandidates(rep *Report) []Result {
	out := []Result{rep.Best}
	for _, sw := range rep.Sweeps {
		pts := append([]Result(nil), sw.Points...)
		if len(pts) == 0 {
			continue
		}
		best := pts[0]
		for _, r := range pts {
			if r.Score.TPS > best.Score.TPS {
				best = r
			}
		}
		for _, want := range []int{best.Point.LBS, 1, best.Point.LBS / 4, best.Point.LBS / 2} {
			if r, ok := nearestLBS(pts, want); ok {
				out = append(out, r)
			}
		}
	}
	return dedupe(out)
}

func nearestLBS(pts []Result, want int) (Result, bool) {
	if want < 1 || len(pts) == 0 {
		return Result{}, false
	}
	best := pts[0]
	for _, r := range pts {
		if abs(r.Point.LBS-want) < abs(best.Point.LBS-want) {
			best = r
		}
	}
	return best, true
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func dedupe(rs []Result) []Result {
	seen := map[Point]bool{}
	var out []Result
	for _, r := range rs {
		if !seen[r.Point] {
			seen[r.Point] = true
			out = append(out, r)
		}
	}
	return out
}

// twoHost grows each policy's best stage-1 point to n GPUs, doubling the
// FSDP group (its collectives cross hosts) or the replicas (only the
// gradient all-reduce does), and keeps those within the memory target and
// Admit.
func (q *Request) twoHost(ev Evaluator, rep *Report, n int) []Result {
	var out []Result
	for _, sw := range append([]Sweep{{AC: rep.Best.Point.AC, Points: []Result{rep.Best}}}, rep.Sweeps...) {
		if len(sw.Points) == 0 {
			continue
		}
		base := sw.Points[0]
		for _, r := range sw.Points {
			if r.Score.TPS > base.Score.TPS {
				base = r
			}
		}
		for _, grow := range []func(*job.Layout){func(l *job.Layout) { l.DPShard *= 2 }, func(l *job.Layout) { l.DPReplicate *= 2 }} {
			p := base.Point
			grow(&p.Layout)
			p.Layout.GPUs = n
			if p.Layout.Validate() != nil || (q.Admit != nil && q.Admit(p) != nil) {
				continue
			}
			s, err := ev.Evaluate(p)
			if err != nil || s.DoesNotFit || s.MemoryFraction > q.MemoryTarget {
				continue
			}
			out = append(out, Result{p, s})
		}
	}
	return dedupe(out)
}

// sensitivities computes each candidate's s_j by multiplying θ_j by
// exp(sim.SensitivityStep) from ev's calibration, as calibrate probes.
func sensitivities(ev *SimEvaluator, cands []Result) ([]SweepJob, error) {
	var jobs []SweepJob
	for _, c := range cands {
		j := SweepJob{Result: c, Sensitivity: map[string]float64{}}
		for _, name := range SweepParams {
			pe := &SimEvaluator{Run: ev.Run, Device: ev.Device, Cluster: ev.Cluster,
				Calibration: perturbed(ev, name, math.Exp(sim.SensitivityStep))}
			s, err := pe.Evaluate(c.Point)
			if err != nil {
				return nil, fmt.Errorf("sweep: %s: %w", c.Point, err)
			}
			j.Sensitivity[name] = math.Log(s.TPS/c.Score.TPS) / sim.SensitivityStep
		}
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// perturbed is ev's calibration with parameter name multiplied by f, as
// calibrate's fit and the TPS interval perturb it (cost.Calibration's
// Perturbed, from the cluster's defaults).
func perturbed(ev *SimEvaluator, name string, f float64) *cost.Calibration {
	var c cost.Calibration
	if ev.Calibration != nil {
		c = *ev.Calibration
	}
	return c.Perturbed(name, math.Log(f), cost.Defaults(ev.Cluster))
}
