package memory

import (
	"github.com/moescope/moescope/internal/band"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// OptionsOf is the memory model's view of a run's recipe and checkpointing
// policy: its storage types, attention (cuDNN and FlashAttention-2 save what
// flash attention saves), loss chunks, AdamW implementation, compiled
// components, loss and reduce types, allocator segments and the most
// loaded expert-parallel rank's share of the routed rows (expert skew). r must be
// resolved (job.Recipe.Resolve).
func OptionsOf(r job.Recipe, ac moe.AC) Options {
	o := Options{Precision: r.Storage(), AC: ac, Attention: Flash, LossChunks: r.LossChunks,
		OptimizerImpl: string(r.Optimizer), LossDType: r.LossDType, ReduceDType: r.ReduceDType, Segments: Fixed,
		Master: r.MasterDType, ExpertLoad: r.ExpertSkew, CUDAGraphs: r.CUDAGraphs}
	if r.Routing == job.RoutingLearned {
		o.RouterCV = band.Uncalibrated().RouterCV
	}
	if r.Attention == job.EagerAttention {
		o.Attention = Eager
	}
	o.Compile.Model, o.Compile.Loss = r.Compiled()
	if r.ExpandableSegments {
		o.Segments = Expandable
	}
	o.FP8Gather.Linear = r.FP8AllGather && r.Converts(job.QuantLinear)
	o.FP8Gather.Output = r.FP8AllGather && r.Converts(job.QuantOutput)
	o.TE.Blocks = r.TransformerImpl == job.TETransformer
	o.TE.Loss = r.LossImpl == job.TELoss
	o.AutoModel = autoModelOf(r)
	o.GradBuffer = r.DDPImpl == job.MegatronDDP
	if o.TE.Blocks && r.Precision.LowPrecision() {
		o.TE.Linear, o.TE.Experts = r.Converts(job.QuantLinear), r.Converts(job.QuantExperts)
		o.TE.MX, o.TE.FP4, o.TE.Block = r.Precision.Microscaled(), r.Precision.FP4(), r.Precision.Blockwise()
	}
	if r.Precision == job.FP8Delayed {
		o.Delayed = r
	}
	return o
}

// EstimateRun is Estimate for the run s, under allocator model a (nil:
// DefaultAllocator).
func EstimateRun(s job.Spec, a *Allocator) (Report, error) {
	if err := s.CheckExpertSkew(); err != nil {
		return Report{}, err
	}
	o := OptionsOf(s.Recipe, s.AC)
	o.Allocator = a
	return Estimate(s.Model, s.Layout, Batch{LBS: s.LBS, Seq: s.Seq, GradAccum: s.GradAccum}, o)
}
