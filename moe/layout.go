package moe

import (
	"errors"
	"fmt"
)

// Sharding says what the dp_shard axis shards.
type Sharding string

// Sharding modes.
const (
	ShardFSDP  Sharding = "fsdp"  // parameters, gradients and optimizer (ZeRO-3)
	ShardZeRO2 Sharding = "zero2" // gradients and optimizer
	ShardZeRO1 Sharding = "zero1" // optimizer only
	ShardDDP   Sharding = "ddp"   // nothing
)

// Layout is a training layout as a plain value: degrees, sharding mode,
// FSDP and pipeline options. world = PP × DPReplicate × DPShard (pp
// outermost, as torchtitan's mesh); EP divides DPShard; the expert mesh of
// each pipeline stage is (DPReplicate, DPShard/EP, EP).
//
// Layout stays comparable (the planner keys maps by it), so the explicit
// stage split PPLayers is a StageLayers string, not a slice.
type Layout struct {
	GPUs                int      `json:"gpus"`
	DPShard             int      `json:"dp_shard"`
	DPReplicate         int      `json:"dp_replicate"`
	EP                  int      `json:"ep"`
	Sharding            Sharding `json:"sharding"`
	ReshardAfterForward bool     `json:"reshard_after_forward"`
	KeepGathered        bool     `json:"keep_gathered"`
	AllreduceLastOnly   bool     `json:"allreduce_last_only"`
	GPUsPerNode         int      `json:"gpus_per_node,omitempty"`
	// Pipeline parallelism (pipeline.go): PP stages (0 or 1 = none), the
	// schedule, sequences per pipeline micro-batch, stages per rank and an
	// explicit split of the transformer layers over the PP·PPVirtualStages
	// stages (empty = torchtitan's default split). Zero values are the
	// defaults Resolve fills when PP > 1.
	PP               int         `json:"pp,omitempty"`
	PPSchedule       PPSchedule  `json:"pp_schedule,omitempty"`
	PPMicrobatchSize int         `json:"pp_microbatch_size,omitempty"`
	PPVirtualStages  int         `json:"pp_virtual_stages,omitempty"`
	PPLayers         StageLayers `json:"pp_layers,omitempty"`

	// GradSyncLastOnly skips every gradient reduction (reduce-scatter and
	// replica all-reduce) on all but the last accumulation micro-step, as
	// FSDP2's set_requires_gradient_sync(False) does: each unit keeps its
	// unsharded gradients, accumulated in the reduce type, across the
	// micro-steps. Only under fsdp sharding. Omitted from JSON when false.
	GradSyncLastOnly bool `json:"grad_sync_last_only,omitempty"`
}

// MaxDegree bounds every degree of a layout (2^20 GPUs, about 50 times
// the largest training job published); MaxGPUsPerNode bounds GPUs per host
// (an HGX host holds 8; the cluster registry's gpus_per_node has the same
// bound).
const (
	MaxDegree      = 1 << 20
	MaxGPUsPerNode = 1 << 16
)

// DefaultLayout is one GPU with torchtitan's defaults.
func DefaultLayout() Layout {
	return Layout{GPUs: 1, DPShard: 1, DPReplicate: 1, EP: 1, Sharding: ShardFSDP, ReshardAfterForward: true}
}

// Resolve fills the degrees left at 0 from the others (any two of GPUs,
// DPShard, DPReplicate fix the third, with PP a factor of GPUs; DPReplicate,
// EP and PP default to 1), the pipeline options' defaults (resolvePipeline)
// and then validates. Every factor is printed when something does not
// divide.
func (l *Layout) Resolve() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{{"gpus", l.GPUs}, {"dp_shard", l.DPShard}, {"dp_replicate", l.DPReplicate}, {"pp", l.PP}} {
		if f.v < 0 {
			errs = append(errs, FieldError{f.name, f.v, "must be ≥ 1 (0 = derive from the others)"})
		}
	}
	if l.EP < 0 {
		errs = append(errs, FieldError{"ep", l.EP, "must be ≥ 1 (0 = 1)"})
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if l.EP == 0 {
		l.EP = 1
	}
	pp := l.Stages()
	if pp > MaxDegree {
		return FieldError{"pp", l.PP, fmt.Sprintf("must be in [1, %d]", MaxDegree)}
	}
	switch {
	case l.GPUs == 0 && l.DPShard > 0:
		if l.DPReplicate == 0 {
			l.DPReplicate = 1
		}
		l.GPUs = pp * l.DPShard * l.DPReplicate
	case l.GPUs > 0 && l.DPShard == 0:
		if l.DPReplicate == 0 {
			l.DPReplicate = 1
		}
		if l.GPUs%(pp*l.DPReplicate) != 0 {
			return fmt.Errorf("gpus = %d is not divisible by pp × dp_replicate = %d × %d", l.GPUs, pp, l.DPReplicate)
		}
		l.DPShard = l.GPUs / (pp * l.DPReplicate)
	case l.GPUs > 0 && l.DPReplicate == 0:
		if l.GPUs%(pp*l.DPShard) != 0 {
			return fmt.Errorf("gpus = %d is not divisible by pp × dp_shard = %d × %d", l.GPUs, pp, l.DPShard)
		}
		l.DPReplicate = l.GPUs / (pp * l.DPShard)
	case l.GPUs == 0:
		return errors.New("gpus: give --gpus or --dp-shard")
	}
	if l.Sharding == "" {
		l.Sharding = ShardFSDP
	}
	if err := l.resolvePipeline(); err != nil {
		return err
	}
	return l.Validate()
}

// Validate checks a fully specified layout; it does not fill defaults.
func (l Layout) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{{"gpus", l.GPUs}, {"dp_shard", l.DPShard}, {"dp_replicate", l.DPReplicate}, {"ep", l.EP}} {
		if f.v < 1 || f.v > MaxDegree {
			errs = append(errs, FieldError{f.name, f.v, fmt.Sprintf("must be in [1, %d]", MaxDegree)})
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// The product is checked in int64: three degrees of up to 2^20 each.
	if prod := int64(l.Stages()) * int64(l.DPReplicate) * int64(l.DPShard); prod != int64(l.GPUs) {
		errs = append(errs, fmt.Errorf("pp × dp_replicate × dp_shard = %d × %d × %d = %d ≠ gpus = %d",
			l.Stages(), l.DPReplicate, l.DPShard, prod, l.GPUs))
	}
	if l.DPShard%l.EP != 0 {
		errs = append(errs, fmt.Errorf("ep = %d does not divide dp_shard = %d (gpus = %d = pp %d × dp_replicate %d × dp_shard %d)",
			l.EP, l.DPShard, l.GPUs, l.Stages(), l.DPReplicate, l.DPShard))
	}
	errs = append(errs, l.validatePipeline()...)
	switch l.Sharding {
	case ShardFSDP, ShardZeRO2, ShardZeRO1, ShardDDP:
	default:
		errs = append(errs, FieldError{"sharding", l.Sharding, "must be fsdp, zero2, zero1 or ddp"})
	}
	if l.GradSyncLastOnly && l.Sharding != ShardFSDP {
		errs = append(errs, FieldError{"grad_sync_last_only", true, fmt.Sprintf("needs sharding fsdp (FSDP2's set_requires_gradient_sync), not %s", l.Sharding)})
	}
	if l.GPUsPerNode < 0 || l.GPUsPerNode > MaxGPUsPerNode {
		errs = append(errs, FieldError{"gpus_per_node", l.GPUsPerNode, fmt.Sprintf("must be in [1, %d] (0 = from the cluster)", MaxGPUsPerNode)})
	}
	return errors.Join(errs...)
}

// CheckModel checks the layout against a model: experts must divide by EP,
// and the pipeline's stages must split the model's layers (StageSplit).
func (l Layout) CheckModel(c *Config) error {
	if l.EP > 1 && (c.Experts == 0 || c.Experts%l.EP != 0) {
		return fmt.Errorf("ep = %d does not divide experts = %d", l.EP, c.Experts)
	}
	if _, err := l.StageSplit(c.Layers); err != nil {
		return err
	}
	return nil
}

// DP is the data-parallel degree of one pipeline stage, dp_replicate ×
// dp_shard.
func (l Layout) DP() int { return l.DPReplicate * l.DPShard }

// ExpertShard is the FSDP degree of expert weights, dp_shard / ep.
func (l Layout) ExpertShard() int { return l.DPShard / l.EP }
