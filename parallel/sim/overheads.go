package sim

import (
	"fmt"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// The costs a real training step pays beyond its model's ops, each priced
// from what it moves at the device's measured rates and named in
// Breakdown.OverheadS (seconds each cost takes, on whichever stream it
// runs; the optimizer's own time is Breakdown.OptimizerS):
//
//	routing: per MoE layer and forward pass, the token reorder torchtitan's
//	  MoE runs before its grouped GEMMs: a histogram of the T·k expert
//	  choices and a stable argsort of them (int64 keys with int64 indices:
//	  8 radix passes of 8 bits, each reading and writing both, 256 bytes per
//	  choice), 4 kernels at least a launch each.
//	fsdp_copy: FSDP2's copy-in before and copy-out after each collective
//	  (cost.ComputeSpec.FSDPCopySeconds): all-gather reads the fp32 shard
//	  and writes it in bf16 (6 bytes per shard element) on its copy-in
//	  stream, then splits the gathered bf16 buffer into the parameters (4
//	  bytes per element) on the compute stream; reduce-scatter copies the
//	  bf16 gradients into the fp32 reduce buffer (6 bytes per element) on
//	  the compute stream and adds the reduced shard into the sharded
//	  gradient (12 bytes per shard element: two reads, one write) on its
//	  own stream.
//	grad_clip: clip_grad_norm_ reads every gradient of the shard for its
//	  norm and again to scale it, writing it back (12 bytes per fp32
//	  parameter), and all-reduces the norm over the world (a latency).
//	loss: the cross-entropy's vocabulary-sized elementwise work (the loss
//	  op of the vocabulary, already in compute; named here).
//	launch: what kernels shorter than a host launch lose waiting for the CPU.
//	host_sync: with expert parallelism torchtitan copies the all-to-all
//	  split sizes to the host (.tolist()) before each dispatch: the CPU waits
//	  for the GPU to drain, then the GPU waits for the next launches: two
//	  launch times idle per dispatch.
//	nccl_contention: compute slowed while NCCL kernels hold NCCLCTAs of its
//	  SMs (the engine runs overlapped compute at (SMs − CTAs)/SMs).
//	sustained_clock: tensor-core kernels run at the clock a GPU sustains
//	  at its power limit, Sustained of the burst rate kernel benchmarks
//	  measure: what that costs over the burst rate.
//	quantize: a low-precision recipe's kernels that cast the bf16 operands
//	  of its converted GEMMs to fp8 (cost.LowPrecision, CastSeconds), and
//	  MX grouped GEMMs' scale rearrangement: memory-bound time inside the
//	  converted ops' prices.
//	amax_reduce: fp8-delayed's amax reductions: TransformerEngine
//	  all-reduces (MAX) the current amaxes of every delayed-scaled tensor
//	  in one blocking call when the forward's autocast region closes and
//	  again in backward (TransformerEngine d0067d0d
//	  transformer_engine/pytorch/quantization.py reduce_and_update_fp8_tensors,
//	  async_op=False), over the tensor-, data- and context-parallel group
//	  (Megatron-LM d98e8a64 megatron/core/fp8_utils.py get_fp8_context:
//	  get_amax_reduction_group(with_context_parallel=True)), whose one
//	  region wraps the whole block stack under delayed scaling
//	  (transformer_block.py: use_outer_quantization_context): per
//	  micro-batch and model chunk, 3 FP32 amaxes per converted GEMM in
//	  forward and 2 in backward (job.Recipe.DelayedGEMMs), priced on the
//	  compute stream with the optimizer step.
//	slowest_gpu: what waiting for the slowest of the job's GPUs costs over
//	  the mean GPU's sustained rate (cost.SlowestShare).
//	cuda_graphs_saved: not a cost but what the run's CUDA graphs save:
//	  the launch floors of the ops they capture (graphs.go), priced
//	  without them; written only when the run has graphs.
//	slowest_node: what waiting for the slowest of the job's nodes costs
//	  beyond that, for the spread between nodes that the device's
//	  one-node measurement does not see (cost.NodeSpreadLoss).

// Overhead names, the keys of Breakdown.OverheadS.
const (
	OverheadRouting        = "routing"
	OverheadFSDPCopy       = "fsdp_copy"
	OverheadGradClip       = "grad_clip"
	OverheadLoss           = "loss"
	OverheadLaunch         = "launch"
	OverheadHostSync       = "host_sync"
	OverheadNCCLContention = "nccl_contention"
	OverheadSustainedClock = "sustained_clock"
	OverheadSlowestGPU     = "slowest_gpu"
	OverheadSlowestNode    = "slowest_node"
	OverheadQuantize       = "quantize"
	OverheadAmaxReduce     = "amax_reduce"
	OverheadGraphSaved     = "cuda_graphs_saved"
)

// Overheads lists the names in report order.
func Overheads() []string { return overheadNames[:] }

// overhead indexes the names in per-op accumulators.
type overhead uint8

const (
	ohRouting overhead = iota
	ohFSDPCopy
	ohGradClip
	ohLoss
	ohLaunch
	ohHostSync
	ohNCCLContention
	ohSustainedClock
	ohSlowestGPU
	ohSlowestNode
	ohQuantize
	ohAmaxReduce
	ohGraphSaved
	numOverheads
)

var overheadNames = [numOverheads]string{OverheadRouting, OverheadFSDPCopy, OverheadGradClip, OverheadLoss,
	OverheadLaunch, OverheadHostSync, OverheadNCCLContention, OverheadSustainedClock, OverheadSlowestGPU, OverheadSlowestNode, OverheadQuantize, OverheadAmaxReduce, OverheadGraphSaved}

// optimizerCost prices the optimizer phase of the prepared run: fused AdamW
// over the rank's shard, and gradient clipping (clip_grad_norm_, torchtitan's
// default max_norm 1.0) with its all-reduce of the norm over the world.
func (p *Prepared) optimizerCost(spec cost.ComputeSpec, cal *cost.Calibration) (optimizerCost, error) {
	oc := optimizerCost{update: spec.MemorySeconds(p.params * spec.BytesPerElement(moe.OpOptimizer, moe.Forward))}
	oc.clip = spec.GradClipSeconds(p.params)
	if p.l.GPUs > 1 {
		g := cost.ShapeOf(p.cl, p.mesh.Group(parallel.AxisDP, 0).Ranks)
		cc, err := cost.Collective(p.cl, cal, parallel.CollAllReduce, g, 4)
		if err != nil {
			return optimizerCost{}, fmt.Errorf("simulate: grad-norm all-reduce: %w", err)
		}
		oc.clip += cc.LatencyS + cc.BandwidthS
	}
	var err error // without pp the amax group is the world
	oc.amax, err = amaxReduceSeconds(p.cl, cal, p.in.Recipe, p.cfg, p.l, p.mem.Units, worldRanks(p.l.GPUs), float64(p.in.GradAccum))
	return oc, err
}

// amaxReduceSeconds prices fp8-delayed's amax all-reduces (amax_reduce
// above) of a rank holding units, over ranks (its tensor-, data- and
// context-parallel group), for reductions micro-batches × model chunks;
// zero under any other recipe or on one rank.
func amaxReduceSeconds(cl *hw.Cluster, cal *cost.Calibration, r job.Recipe, cfg *moe.Config, l job.Layout, units []memory.Unit, ranks []int, reductions float64) (float64, error) {
	if r.Precision != job.FP8Delayed || len(ranks) < 2 {
		return 0, nil
	}
	gemms := r.DelayedGEMMs(cfg, l, memory.UnitLayers(units))
	var t float64
	for _, amaxes := range []int64{job.AmaxForward * gemms, job.AmaxBackward * gemms} {
		cc, err := cost.Collective(cl, cal, parallel.CollAllReduce, cost.ShapeOf(cl, ranks), float64(4*amaxes))
		if err != nil {
			return 0, fmt.Errorf("simulate: amax all-reduce: %w", err)
		}
		t += cc.Seconds()
	}
	return t * reductions, nil
}

// worldRanks lists ranks 0 … n−1.
func worldRanks(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// contention is how much longer the compute ops ran than their modelled
// durations: the time NCCL's kernels took from them.
func contention(sim *simulated, spans []simSpan) float64 {
	var t float64
	for i, o := range sim.ops {
		if !o.coll && o.compute > 0 {
			t += (spans[i].end - spans[i].start) - o.compute
		}
	}
	return t
}
