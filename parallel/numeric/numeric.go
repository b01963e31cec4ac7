package numeric

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// Spec describes a numeric (goroutine-rank) training run: the run (its
// model, batch, checkpointing, and recipe, whose storage types the ranks'
// memory accounts and collectives use; empty fields are
// job.DefaultRecipe's) on a mesh, whose layout is the one the ranks form
// (the run's own Layout is not read), and what only training needs.
type Spec struct {
	job.Spec
	Mesh     *parallel.Mesh
	DataSeed uint64
	AdamW    ref.AdamW
	AuxCoef  float64       // coefficient of HF's load-balancing loss; 0 neither computes nor adds it
	BiasRate float64       // selection-bias update rate γ (sigmoid routers with a selection bias)
	Timeout  time.Duration // per collective wait; 0 means collective.DefaultTimeout
	// Numerics is the reference's arithmetic (zero: float32): bf16
	// rounding, and a low-precision recipe's fake-quantised GEMMs, which
	// each rank quantises on its own (its own amax, as the frameworks do
	// without an amax reduction).
	Numerics job.Numerics
	// CP is the context parallelism the ranks run (cp.go); Mesh is then
	// the layout with cp folded into dp_shard.
	CP CP

	storage moe.Precision // the recipe's storage types, resolved by New
}

// data is the run's data plan over the mesh's data-parallel ranks.
func (s Spec) data() parallel.Batch {
	return parallel.Batch{LBS: s.LBS, Seq: s.Seq, GradAccum: s.GradAccum, DP: s.Mesh.Layout.DP() / s.CP.degree()}
}

// Trainer trains the reference model with one goroutine per rank, each
// holding its own shards, optimizer state and memory account, and moving
// data only through the collectives of collective.Comm. It runs the program
// BuildSchedule describes (the same collectives, in the same order, on the
// same groups, at the same sizes; TestNumericFollowsSchedule checks it).
//
// With tp > 1 (tp.go: sequence parallelism, ep = 1 or etp = tp) each rank
// holds its tensor-parallel pieces of the weights before FSDP shards them;
// its tensor-parallel collectives are checked per layer against
// parallel.TPCollectives (TestTPCollectivesAreTheListed), and each axis's
// collectives against the schedule's on that axis, the all-reduce over tp
// of every unit's replicated tensors' gradients included
// (TestNumericTPFollowsSchedule).
//
// With CP (Spec.CP, cp.go) the mesh is the layout with cp folded into
// dp_shard; the cp ranks of a data-parallel rank split its sequences and
// exchange keys and values in attention (cpAttention), collectives the
// schedule does not list yet.
//
// Sharding (over dp_shard for dense units, over efsdp = dp_shard/ep for
// expert units; FSDPShard geometry, padded dim-0 or dim-1 chunks):
//
//	fsdp:  parameters, gradients and AdamW moments sharded; weights
//	       all-gathered before a unit's compute and freed as the schedule says
//	zero2: parameters full; gradients and moments sharded; the updated
//	       shards all-gathered after the step
//	zero1: parameters and gradients full (all-reduced); moments sharded
//	ddp:   everything full; gradients all-reduced
//
// Gradient reduction per micro-step: reduce-scatter (fsdp, zero2) or
// all-reduce (zero1, ddp) of the micro-step's gradient over the shard
// group, accumulated as acc + g_0 + g_1 + … in group order; then over
// replicas: all-reduce of each micro-step's reduced gradient, or, with
// allreduce-last-only, of the accumulated one on the last micro-step.
// With grad-sync-last-only no collective runs before the last micro-step:
// each unit's whole gradients are summed locally, and the last micro-step
// reduces the sum as above.
type Trainer struct {
	spec  Spec
	comm  *collective.Comm
	ranks []*numRank
	step  int

	fault *Fault // armed by SetFault
	// rankErrs holds each rank's error of the last Step.
	rankErrs []error
	// loads[k][e] is the (token, slot) pairs the k-th MoE layer routed to
	// expert e over every step, micro-step and rank so far (ExpertLoads).
	loads [][]int64
}

// StepResult is the outcome of one optimizer step.
type StepResult struct {
	Step      int
	Loss, Aux float64 // means over the step's micro-batches (all ranks), as one rank would compute them
	// Losses holds each micro-batch's cross-entropy in the order one rank
	// with grad-accum DP·Micro would run them (micro-step m, then rank r).
	Losses []float64
	Tokens int64 // tokens one rank processed in the step (LBS·Seq/cp·Micro)
	// ExpertCounts[m][r][l][e] is how many (token, slot) pairs of rank r's
	// micro-batch m layer l routed to expert e (nil for dense layers):
	// what Schedule.WithCounts needs to size this step's all-to-alls.
	ExpertCounts [][][][]int
	PeakBytes    []int64 // per rank, the peak of live bytes at the modelled dtypes during the step
}

// New places every rank's shards of the initial parameters init
// (moe.Config.Params order, as moe.LoadParams returns them).
func New(spec Spec, init [][]float32) (*Trainer, error) {
	cfg, m := spec.Model, spec.Mesh
	if cfg == nil || m == nil {
		return nil, errors.New("numeric: config and mesh are required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := refuseGPTOSS(cfg); err != nil {
		return nil, err
	}
	if err := spec.Batch.Validate(); err != nil {
		return nil, err
	}
	if err := spec.CP.check(cfg, m.Layout, spec.Batch.Seq); err != nil {
		return nil, err
	}
	if err := spec.data().Validate(); err != nil {
		return nil, err
	}
	if err := spec.Recipe.Resolve(); err != nil {
		return nil, fmt.Errorf("numeric: %w", err)
	}
	spec.storage = spec.Storage()
	if err := spec.checkNumerics(); err != nil {
		return nil, err
	}
	if err := m.Layout.CheckModel(cfg); err != nil {
		return nil, err
	}
	if tp := m.Layout.TPDegree(); tp > 1 {
		if err := m.Layout.CheckSeq(spec.Batch.Seq); err != nil {
			return nil, fmt.Errorf("numeric: %w", err)
		}
	}
	ps := cfg.Params()
	if len(init) != len(ps) {
		return nil, fmt.Errorf("numeric: %d initial tensors, model has %d", len(init), len(ps))
	}
	for i, p := range ps {
		if int64(len(init[i])) != p.Elements() {
			return nil, fmt.Errorf("numeric: %s has %d elements, want %d", p.Name, len(init[i]), p.Elements())
		}
	}
	n := &Trainer{spec: spec, comm: collective.New(m)}
	n.comm.Timeout = spec.Timeout
	for r := 0; r < m.World(); r++ {
		nr, err := newNumRank(&n.spec, r, init)
		if err != nil {
			return nil, err
		}
		n.ranks = append(n.ranks, nr)
	}
	return n, nil
}

// Comm returns the communicator (its Stats hold every byte moved).
func (n *Trainer) Comm() *collective.Comm { return n.comm }

// StepIndex is the number of optimizer steps taken.
func (n *Trainer) StepIndex() int { return n.step }

// Step runs one optimizer step on every rank. After an error the ranks'
// states may be partly updated: the Trainer must not be stepped again.
func (n *Trainer) Step(ctx context.Context) (StepResult, error) {
	res := StepResult{Step: n.step}
	losses := make([][]float64, len(n.ranks))
	n.rankErrs = make([]error, len(n.ranks))
	err := n.comm.Run(ctx, func(ctx context.Context, ep *collective.Endpoint) error {
		r := n.ranks[ep.Rank()]
		r.fault = n.fault
		ls, err := r.runStep(ctx, ep, n.step)
		losses[ep.Rank()] = ls
		n.rankErrs[ep.Rank()] = err
		return err
	})
	if err != nil {
		return res, err
	}
	// Every rank holds every micro-batch's (loss, aux); rank 0's copy is
	// the step's record.
	b := n.spec.data()
	all := losses[0]
	var sl, sa float64
	for i := 0; i < len(all); i += 2 {
		res.Losses = append(res.Losses, all[i])
		sl += all[i]
		sa += all[i+1]
	}
	cnt := float64(b.DP * b.GradAccum)
	res.Loss, res.Aux = sl/cnt, sa/cnt
	res.Tokens = int64(b.LBS) * int64(b.Seq/n.spec.CP.degree()) * int64(b.GradAccum)
	for _, r := range n.ranks {
		res.PeakBytes = append(res.PeakBytes, r.mem.peak)
	}
	res.ExpertCounts = make([][][][]int, b.GradAccum)
	for m := range res.ExpertCounts {
		for _, r := range n.ranks {
			res.ExpertCounts[m] = append(res.ExpertCounts[m], r.counts[m])
		}
	}
	n.addLoads(res.ExpertCounts)
	n.step++
	if math.IsNaN(res.Loss) || math.IsInf(res.Loss, 0) || math.IsNaN(res.Aux) || math.IsInf(res.Aux, 0) {
		// The update has been applied with non-finite gradients: nothing
		// after it (a checkpoint, a report) may be trusted.
		return res, fmt.Errorf("step %d: loss %v, aux %v: training diverged; the weights are no longer finite and nothing of this run is saved", res.Step+1, res.Loss, res.Aux)
	}
	return res, nil
}

// addLoads adds a step's counts ([m][r][layer][e]) into loads, MoE layers
// in order.
func (n *Trainer) addLoads(counts [][][][]int) {
	for _, byRank := range counts {
		for _, layers := range byRank {
			k := 0
			for _, row := range layers {
				if len(row) == 0 {
					continue // a dense layer
				}
				if k == len(n.loads) {
					n.loads = append(n.loads, make([]int64, len(row)))
				}
				for e, c := range row {
					n.loads[k][e] += int64(c)
				}
				k++
			}
		}
	}
}

// ExpertLoads is the (token, slot) pairs each MoE layer (in order) routed
// to each expert over every step so far, summed over micro-steps and ranks:
// the router's load as the simulator replays it (job.Routing's file, sim's
// Input.ExpertCounts). Under tensor parallelism every member of a group
// counts the same rows, which scales the counts and not their shares.
func (n *Trainer) ExpertLoads() [][]int64 { return n.loads }

// RankErrors returns each rank's error of the last Step (nil for a rank
// that finished it): after a failure, whether every rank stopped.
func (n *Trainer) RankErrors() []error { return append([]error(nil), n.rankErrs...) }

// Params reassembles the full parameters (Config.Params order) from the
// ranks' shards.
func (n *Trainer) Params() [][]float32 {
	ps := n.spec.Model.Params()
	out := make([][]float32, len(ps))
	for _, r := range n.ranks {
		if r.coord.Replica == 0 { // replicas hold copies
			r.collectFull(out)
		}
	}
	// Buffers (selection bias) are replicated: take rank 0's.
	n.ranks[0].collectBuffers(out)
	return out
}

// OptimizerState reassembles the AdamW moments (Params order; nil for
// buffers) and returns the optimizer step count.
func (n *Trainer) OptimizerState() (m, v [][]float32, step int64) {
	ps := n.spec.Model.Params()
	m, v = make([][]float32, len(ps)), make([][]float32, len(ps))
	for _, r := range n.ranks {
		if r.coord.Replica == 0 {
			r.collectMoments(m, v)
		}
	}
	return m, v, n.ranks[0].optStep
}

// SetOptimizerState loads AdamW moments (Params order, as OptimizerState
// returns them) into every rank's shards and sets the step count and the
// number of optimizer steps taken.
func (n *Trainer) SetOptimizerState(m, v [][]float32, step int64) error {
	ps := n.spec.Model.Params()
	if len(m) != len(ps) || len(v) != len(ps) {
		return fmt.Errorf("optimizer state: %d/%d tensors, model has %d", len(m), len(v), len(ps))
	}
	for i, p := range ps {
		if p.Buffer {
			continue
		}
		if int64(len(m[i])) != p.Elements() || int64(len(v[i])) != p.Elements() {
			return fmt.Errorf("optimizer state of %s: %d/%d elements, want %d", p.Name, len(m[i]), len(v[i]), p.Elements())
		}
	}
	for _, r := range n.ranks {
		r.loadMoments(m, v)
		r.optStep = step
	}
	n.step = int(step)
	return nil
}
