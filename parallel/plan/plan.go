package plan

import (
	"fmt"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/sim"
)

// The planner searches layouts (dp_shard × dp_replicate × ep, sharding mode,
// FSDP options), activation-checkpointing policies and local batch sizes for
// the most tokens per second per GPU within a memory target, the way a team
// does it by hand: sweep everything at one or two nodes, keep the best
// candidates, then multiply the GPU count, growing the FSDP group or the
// replica count (whichever pays), until the target count.
//
// It is written against Evaluator, so the same search runs on the
// virtual-time backend (the real evaluator) and on analytic stand-ins in
// tests.

// Point is one point of the search space: a layout, a checkpointing
// policy, a local batch (sequences per data-parallel rank per micro-step)
// and the gradient-accumulation micro-steps per optimizer step.
type Point struct {
	Layout    job.Layout
	AC        moe.AC
	LBS       int
	GradAccum int
}

// GlobalBatch is the sequences one optimizer step consumes:
// lbs × dp_replicate × dp_shard × grad_accum (pipeline stages share them).
func (p Point) GlobalBatch() int { return p.LBS * p.Layout.DP() * p.GradAccum }

func (p Point) String() string {
	return fmt.Sprintf("%s ac=%s lbs=%d grad_accum=%d", p.Layout.Label(), p.AC, p.LBS, p.GradAccum)
}

// Score is what an evaluator predicts for a point. TPS is a rank's own
// tokens per second (torchtitan's definition); MFU is a fraction under the
// torchtitan FLOP convention; MemoryFraction = peak reserved / device memory.
type Score struct {
	TPS            float64
	MFU            float64
	MemoryFraction float64
	// DoesNotFit: peak reserved plus the memory outside PyTorch's
	// allocator exceeds the device (verdict.Fit; an evaluator that does not
	// model that memory leaves it false). The planner never returns such a
	// point, whatever its target.
	DoesNotFit bool
	StepTimeS  float64
	Bottleneck string
	// Breakdown is the step split along the critical path of the slowest
	// rank, in the simulator's shape, so `plan --json` and `simulate
	// --json` print one object; stand-in evaluators fill what they model.
	Breakdown sim.Breakdown
	// TPSInterval is TPS's 90% interval, filled for the reported plans
	// only (SimEvaluator.Intervals); nil otherwise. Indistinguishable
	// marks a plan other than the best whose interval reaches the best's:
	// the model cannot tell them apart.
	TPSInterval       *[2]float64
	Indistinguishable bool
}

// Evaluator predicts points for the planner. Implementations must be
// safe for concurrent use: the planner calls them from several goroutines.
type Evaluator interface {
	// MemoryFraction is the peak reserved memory of p over the device's
	// memory; it must be cheap (the planner prunes with it before
	// simulating) and non-decreasing in p.LBS.
	MemoryFraction(p Point) (float64, error)
	// Evaluate predicts step time, TPS, MFU and memory of p.
	Evaluate(p Point) (Score, error)
}

// Request describes a search.
type Request struct {
	GPUs        int // target world size
	GPUsPerNode int // GPUs per host; stage 1 runs at one or two hosts
	// Experts is the routed-expert count (0 for a dense model): ep ranges
	// over the common divisors of experts and dp_shard.
	Experts int
	// MemoryTarget bounds MemoryFraction, in (0, 1].
	MemoryTarget float64
	// GlobalBatch, in sequences, fixes lbs × gpus × grad_accum at the target
	// scale; 0 leaves it free (grad_accum = 1). Earlier stages ignore it.
	GlobalBatch int
	// MaxLBS caps the local batch (default 256).
	MaxLBS int
	// ACs are the checkpointing policies searched (default DefaultACs: none, selective, full).
	ACs []moe.AC
	// Shardings are the modes the dp_shard axis may use (default fsdp,
	// zero2, zero1, ddp).
	Shardings []job.Sharding
	// TPs are the tensor-parallel degrees searched (default 1 only): each
	// that divides a stage's GPUs and fits in a host (GPUsPerNode, the
	// NVLink domain of the usual clusters); with ep > 1 both etp = 1 and
	// etp = tp are tried. A family keeps its tp as it grows. Admit should
	// refuse the degrees the model cannot split (job.Layout.CheckModel;
	// TPAdmit).
	TPs []int
	// CPs are the context-parallel degrees searched (cp.go); none given
	// searches cp 1 and, when no layout fits without it, AutoCPs.
	CPs []int
	// PPs are the pipeline-parallel degrees searched (default 1 only):
	// each that divides a stage's GPUs (pp × tp of them, with each tp of
	// TPs: tensor parallelism inside every pipeline stage) and splits
	// Layers + 2 (the embedding and the output counted as one layer each,
	// torchtitan's pipeline_parallel_first/last_stage_less_layers)
	// into pp × virtual stages equal parts of at least two, torchtitan's
	// even split without remainder. A pipeline family is tried with each
	// schedule of PPSchedules (1 stage per rank for single-stage
	// schedules, 2 for multi-stage ones, torchtitan's default), each micro-batch size of
	// PPMicrobatchSizes, and fsdp without reshard-after-forward (torchtitan's
	// default under pp; the other modes are not searched with pp, and none
	// when Shardings lacks fsdp). Pipelines enter the search at stage 1
	// with every degree that divides its GPUs, and a family keeps its
	// pipeline as it grows, as it keeps tp (growing pp as well multiplied
	// the costliest estimates of the later stages).
	PPs []int
	// PPSchedules are the pipeline schedules tried with pp > 1 (default
	// 1F1B and Interleaved1F1B; the zero-bubble ones only when asked, each
	// doubling a pipeline family's evaluations).
	PPSchedules []job.PPSchedule
	// PPMicrobatchSizes are the sequences per pipeline micro-batch tried
	// (default 1 and 2); a pipeline's local batch is a multiple of one.
	PPMicrobatchSizes []int
	// Layers is the model's transformer layers, which pp stages split
	// (needed when PPs has a degree above 1).
	Layers int
	// Carry is how many layout families each stage hands to the next (default 8).
	Carry int
	// Exhaustive searches the whole space at the target scale instead of
	// the hierarchical stages.
	Exhaustive bool
	// GradSyncLastOnly also searches, for every fsdp layout with
	// accumulation, its variant that reduces gradients on the last
	// micro-step only (job.Layout.GradSyncLastOnly); off by default, as
	// torchtitan cannot run it.
	GradSyncLastOnly bool
	// Admit, when set, rejects points the caller cannot use (an export
	// target that cannot express them); a non-nil error names the reason.
	Admit func(Point) error
	// Workers evaluating in parallel (default GOMAXPROCS).
	Workers int
	// Progress, when set, is called after each evaluation with the stage
	// number (1-based), points done and points to do in that stage.
	Progress func(stage, done, total int)
	// perGPUCap, set on the copy of the request a stage before the
	// target runs with, is the target's global batch per GPU: no family
	// there can use a local batch above perGPUCap × the GPUs that share a
	// data-parallel rank's sequences (dpShare: its tp ranks and pipeline
	// stages), so earlier stages do not rank it at one (lbsTop).
	perGPUCap int
	// autoCP: the caller named no cp degree, so the search may turn to
	// AutoCPs when nothing fits without them.
	autoCP bool
}

// TPAdmit is admit (nil: every point) behind the checks of each point's
// layout against cfg and sequences of seq tokens (job.Layout.CheckModel,
// CheckSeq): a Request searching tensor-parallel degrees above 1 refuses
// those the model or the sequence cannot split before any estimate.
func TPAdmit(cfg *moe.Config, seq int, admit func(Point) error) func(Point) error {
	return func(p Point) error {
		if err := p.Layout.CheckModel(cfg); err != nil {
			return err
		}
		if err := p.Layout.CheckSeq(seq); err != nil {
			return err
		}
		if admit != nil {
			return admit(p)
		}
		return nil
	}
}

// Result is an evaluated point.
type Result struct {
	Point Point
	Score Score
}

// Stage reports one stage of the search.
type Stage struct {
	GPUs int
	// Candidates is the number of points enumerated; Pruned of them failed
	// the memory target (or Admit) before simulation; Simulated were
	// evaluated.
	Candidates, Pruned, Simulated int
	// Survivors are the best results of the stage, one per family, best
	// first; at the last stage they are the plans.
	Survivors []Result
	// BestTPS is the best per-GPU TPS of the stage; ScalingEfficiency =
	// BestTPS / stage 1's BestTPS.
	BestTPS           float64
	ScalingEfficiency float64
	// Grew says how the best plan's layout grew from its stage-1 ancestor
	// family at the previous stage (e.g. "dp_shard ×4").
	Grew string
}

// Report is the outcome of a search.
type Report struct {
	Stages []Stage
	// Plans are the evaluated points at the target scale, best first
	// (highest TPS; ties broken by lower memory fraction).
	Plans []Result
	Best  Result
	// Calibrated says a calibration priced the plans (their intervals are
	// its fit's where it carries one).
	Calibrated bool
	// Simulated counts evaluations over all stages (sweeps included).
	Simulated int
	// Sweeps are, at stage 1, every local batch up to the memory limit of
	// the best family of each checkpointing policy.
	Sweeps []Sweep
	// Exhaustive says the report comes from the exhaustive search.
	Exhaustive bool
	// Knobs is what turning each setting of the stack would change for the
	// best plan (SimEvaluator.KnobEffects), the plan first; empty unless
	// asked for.
	Knobs []KnobEffect
	// CPNote says the search turned to context parallelism on its own
	// because no layout fitted without it (empty otherwise).
	CPNote string
}

// Sweep is one family's TPS and memory against local batch.
type Sweep struct {
	AC     moe.AC
	Points []Result
}

// InfeasibleError explains why no plan exists: what came closest and
// what would be needed.
type InfeasibleError struct {
	GPUs    int
	Reason  string
	Closest *Result // lowest memory fraction seen, when one was evaluated
	Needed  string
}

func (e *InfeasibleError) Error() string {
	gpus := "GPUs"
	if e.GPUs == 1 {
		gpus = "GPU"
	}
	s := fmt.Sprintf("no feasible plan on %d %s: %s", e.GPUs, gpus, e.Reason)
	if e.Closest != nil {
		s += fmt.Sprintf("; closest: %s at memory fraction %.4g", e.Closest.Point, e.Closest.Score.MemoryFraction)
	}
	if e.Needed != "" {
		s += "; needed: " + e.Needed
	}
	return s
}
