package job

import (
	"errors"
	"fmt"
	"slices"

	"github.com/moescope/moescope/moe"
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

// FSDPImpl names the FSDP implementation whose schedule fsdp sharding
// follows: its units, when their all-gathers are issued and how many
// gradient reductions may be in flight (parallel.BuildSchedule). Both shard
// the same tensors; the memory package models FSDP2's buffers only.
type FSDPImpl string

// FSDP implementations.
const (
	// FSDPTorch is PyTorch's FSDP2 (fully_shard) as torchtitan applies it:
	// a block and, with ep > 1, its routed experts are separate units.
	FSDPTorch FSDPImpl = "fsdp2"
	// FSDPMegatron is Megatron-Core's own FSDP (--use-custom-fsdp with
	// --data-parallel-sharding-strategy optim_grads_params, Megatron-LM
	// 1e057005 megatron/core/distributed/custom_fsdp): a transformer layer
	// is one unit.
	FSDPMegatron FSDPImpl = "megatron"
)

// Layout is a training layout as a plain value: degrees, sharding mode,
// FSDP and pipeline options. world = PP × DPReplicate × DPShard × CP × TP
// (pp outermost, then dp_replicate, dp_shard, cp, tp innermost, as
// torchtitan's mesh); the expert mesh of each pipeline stage is
// (DPReplicate, efsdp, EP, ETP) over the stage's ranks, with efsdp =
// DPShard·CP·TP/(EP·ETP) as torchtitan v0.2.2's ParallelDims builds it
// (see ExpertShard).
//
// Layout stays comparable (the planner keys maps by it), so the explicit
// stage split PPLayers is a StageLayers string, not a slice.
type Layout struct {
	GPUs        int `json:"gpus"`
	DPShard     int `json:"dp_shard"`
	DPReplicate int `json:"dp_replicate"`
	EP          int `json:"ep"`
	// TP is the tensor-parallel degree, with sequence parallelism and loss
	// parallelism (torchtitan's plan: column-wise q/k/v, w1/w3 and LM
	// head, row-wise o and w2, sequence-parallel norms); 0 in JSON = 1.
	TP int `json:"tp,omitempty"`
	// ETP is the tensor-parallel degree of routed experts when ep > 1:
	// torchtitan v0.2.2's expert_tensor_parallel_degree, 1 (EP borrows the
	// tp ranks too) or TP (EP borrows from dp_shard only); 0 in JSON = 1,
	// its default. With ep = 1 the experts are split over tp whatever ETP
	// says (ExpertTP).
	ETP int `json:"etp,omitempty"`
	// CP is the context-parallel degree (cp.go), between dp_shard and tp in
	// the mesh; 0 in JSON = 1. CPMethod and CPLoadBalancer are its K/V
	// exchange and its token dealing ("" = torchtitan's defaults when cp >
	// 1; empty when cp = 1).
	CP             int            `json:"cp,omitempty"`
	CPMethod       CPMethod       `json:"cp_method,omitempty"`
	CPLoadBalancer CPLoadBalancer `json:"cp_load_balancer,omitempty"`
	Sharding       Sharding       `json:"sharding"`
	// FSDPImpl is the FSDP implementation under fsdp sharding; "" in JSON
	// = fsdp2.
	FSDPImpl            FSDPImpl `json:"fsdp_impl,omitempty"`
	ReshardAfterForward bool     `json:"reshard_after_forward"`
	KeepGathered        bool     `json:"keep_gathered"`
	AllreduceLastOnly   bool     `json:"allreduce_last_only"`
	// AsyncTP is torchtitan's enable_async_tensor_parallel: the TP
	// all-gathers and reduce-scatters are decomposed and overlapped with
	// the matmuls they feed (torch.compile's micro-pipeline TP).
	AsyncTP     bool `json:"async_tp,omitempty"`
	GPUsPerNode int  `json:"gpus_per_node,omitempty"`
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
	// PPImpl is the pipeline implementation whose buffers a stage holds
	// (PPImpl's constants); "" in JSON = torch.
	PPImpl PPImpl `json:"pp_impl,omitempty"`

	// GradSyncLastOnly skips every gradient reduction (reduce-scatter and
	// replica all-reduce) on all but the last accumulation micro-step, as
	// FSDP2's set_requires_gradient_sync(False) does: each unit keeps its
	// unsharded gradients, accumulated in the reduce type, across the
	// micro-steps. Under zero1 and ddp, whose gradients are whole on every
	// rank, it is DDP's no_sync and Megatron-Core's no_sync_func
	// (forward_backward_no_pipelining runs every micro-batch but the last
	// inside it; megatron/core/pipeline_parallel/schedules.py, Megatron-LM
	// d98e8a64). Not under zero2. Omitted from JSON when false.
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
	return Layout{GPUs: 1, DPShard: 1, DPReplicate: 1, EP: 1, TP: 1, ETP: 1, Sharding: ShardFSDP, ReshardAfterForward: true}
}

// FSDPShards says FSDP shards the parameters over more than one rank
// (sharding fsdp, dp_shard > 1): what FSDP's per-unit all-gathers need.
func (l Layout) FSDPShards() bool { return l.Sharding == ShardFSDP && l.DPShard > 1 }

// Resolve fills the degrees left at 0 from the others (GPUs, DPShard and
// DPReplicate: any two fix the third, given PP and TP; DPReplicate, EP, TP,
// ETP and PP default to 1), the pipeline options' defaults
// (resolvePipeline) and then validates. Every factor is printed when
// something does not divide.
func (l *Layout) Resolve() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{{"gpus", l.GPUs}, {"dp_shard", l.DPShard}, {"dp_replicate", l.DPReplicate}, {"pp", l.PP}} {
		if f.v < 0 || f.v > MaxDegree {
			errs = append(errs, moe.FieldError{Field: f.name, Value: f.v, Allowed: fmt.Sprintf("must be in [1, %d] (0 = derive from the others)", MaxDegree)})
		}
	}
	for _, f := range []struct {
		name string
		v    *int
	}{{"ep", &l.EP}, {"tp", &l.TP}, {"etp", &l.ETP}, {"cp", &l.CP}} {
		if *f.v < 0 || *f.v > MaxDegree {
			errs = append(errs, moe.FieldError{Field: f.name, Value: *f.v, Allowed: fmt.Sprintf("must be in [1, %d] (0 = 1)", MaxDegree)})
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for _, v := range []*int{&l.EP, &l.TP, &l.ETP} {
		if *v == 0 {
			*v = 1
		}
	}
	pp, ct := l.Stages(), l.CPDegree()*l.TP // cp and tp are ≤ 2^20 each here
	if pp > MaxDegree {
		return moe.FieldError{Field: "pp", Value: l.PP, Allowed: fmt.Sprintf("must be in [1, %d]", MaxDegree)}
	}
	switch {
	case l.GPUs == 0 && l.DPShard > 0:
		if l.DPReplicate == 0 {
			l.DPReplicate = 1
		}
		if n := int64(pp) * int64(l.DPShard) * int64(l.DPReplicate) * int64(ct); n > MaxDegree {
			return moe.FieldError{Field: "gpus", Value: n, Allowed: fmt.Sprintf("pp × dp_shard × dp_replicate × cp × tp = %d × %d × %d × %d × %d must be at most %d", pp, l.DPShard, l.DPReplicate, l.CPDegree(), l.TP, MaxDegree)}
		}
		l.GPUs = pp * l.DPShard * l.DPReplicate * ct
	case l.GPUs > 0 && l.DPShard == 0:
		if l.DPReplicate == 0 {
			l.DPReplicate = 1
		}
		// torchtitan's dp_shard = -1: world / (dp_replicate·cp·tp·pp).
		if others := int64(pp) * int64(l.DPReplicate) * int64(ct); int64(l.GPUs)%others != 0 {
			return fmt.Errorf("gpus = %d is not divisible by %sdp_replicate × %stp = %s%d × %s%d = %d", l.GPUs, ppFactor(pp), cpFactor(l.CPDegree()), ppValue(pp), l.DPReplicate, cpValue(l.CPDegree()), l.TP, others)
		}
		l.DPShard = l.GPUs / (pp * l.DPReplicate * ct)
	case l.GPUs > 0 && l.DPReplicate == 0:
		if others := int64(pp) * int64(l.DPShard) * int64(ct); int64(l.GPUs)%others != 0 {
			return fmt.Errorf("gpus = %d is not divisible by %sdp_shard × %stp = %s%d × %s%d = %d", l.GPUs, ppFactor(pp), cpFactor(l.CPDegree()), ppValue(pp), l.DPShard, cpValue(l.CPDegree()), l.TP, others)
		}
		l.DPReplicate = l.GPUs / (pp * l.DPShard * ct)
	case l.GPUs == 0:
		return errors.New("gpus: give --gpus or --dp-shard")
	}
	if l.FSDPImpl == FSDPTorch {
		l.FSDPImpl = "" // the default, one key for the planner's maps
	}
	if l.Sharding == "" {
		l.Sharding = ShardFSDP
	}
	if l.PPImpl == PPTorch {
		l.PPImpl = "" // the default, one key for the planner's maps
	}
	l.resolveCP()
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
			errs = append(errs, moe.FieldError{Field: f.name, Value: f.v, Allowed: fmt.Sprintf("must be in [1, %d]", MaxDegree)})
		}
	}
	// tp and etp may be left at 0 (= 1) by a layout written before they
	// existed; Resolve writes 1.
	for _, f := range []struct {
		name string
		v    int
	}{{"tp", l.TP}, {"etp", l.ETP}, {"cp", l.CP}} {
		if f.v < 0 || f.v > MaxDegree {
			errs = append(errs, moe.FieldError{Field: f.name, Value: f.v, Allowed: fmt.Sprintf("must be in [1, %d] (0 = 1)", MaxDegree)})
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	tp, etp, pp, cp := l.TPDegree(), max(l.ETP, 1), l.Stages(), l.CPDegree()
	// The products below stay far from overflow: each factor is at most
	// 2^20, and a product is formed only of factors whose product with
	// the world was checked first.
	if int64(pp)*int64(l.DPReplicate)*int64(l.DPShard)*int64(cp)*int64(tp) != int64(l.GPUs) {
		errs = append(errs, fmt.Errorf("%sdp_replicate × dp_shard × %stp = %s%d × %d × %s%d ≠ gpus = %d",
			ppFactor(pp), cpFactor(cp), ppValue(pp), l.DPReplicate, l.DPShard, cpValue(cp), tp, l.GPUs))
		return errors.Join(errs...)
	}
	// torchtitan v0.2.2 ParallelDims._validate: "Currently we only support
	// ETP=TP or ETP=1", checked there only when ep > 1. With ep = 1 etp has
	// no effect in v0.2.2 (the experts take the tp mesh) and another value
	// only shapes its unused sparse mesh; moescope refuses it whatever ep
	// is rather than carry a degree that means nothing.
	if etp != 1 && etp != tp {
		errs = append(errs, moe.FieldError{Field: "etp", Value: etp, Allowed: fmt.Sprintf("must be 1 or tp = %d (torchtitan v0.2.2 supports only etp = tp or etp = 1)", tp)})
	} else if region := l.DPShard * cp * tp; region%(l.EP*l.ExpertTP()) != 0 {
		// The sparse mesh (dp_replicate, efsdp, ep, etp) unflattens
		// dp_shard·cp·tp: ep·etp must divide it (v0.2.2; torchtitan main,
		// which has no etp, requires ep | dp_shard·cp·tp).
		switch {
		case cp > 1:
			errs = append(errs, fmt.Errorf("ep × etp = %d × %d does not divide dp_shard × cp × tp = %d × %d × %d = %d: efsdp = dp_shard·cp·tp/(ep·etp) would not be whole (gpus = %d = %sdp_replicate %d × dp_shard %d × cp %d × tp %d; etp = %d)",
				l.EP, l.ExpertTP(), l.DPShard, cp, tp, region, l.GPUs, ppWord(pp), l.DPReplicate, l.DPShard, cp, tp, etp))
		case tp == 1:
			errs = append(errs, fmt.Errorf("ep = %d does not divide dp_shard = %d (gpus = %d = %sdp_replicate %d × dp_shard %d)",
				l.EP, l.DPShard, l.GPUs, ppWord(pp), l.DPReplicate, l.DPShard))
		default:
			errs = append(errs, fmt.Errorf("ep × etp = %d × %d does not divide dp_shard × tp = %d × %d = %d: efsdp = dp_shard·tp/(ep·etp) would not be whole (gpus = %d = %sdp_replicate %d × dp_shard %d × tp %d; etp = %d)",
				l.EP, l.ExpertTP(), l.DPShard, tp, region, l.GPUs, ppWord(pp), l.DPReplicate, l.DPShard, tp, etp))
		}
	}
	errs = append(errs, l.validatePipeline()...)
	errs = append(errs, l.validateCP()...)
	switch l.Sharding {
	case ShardFSDP, ShardZeRO2, ShardZeRO1, ShardDDP:
	default:
		errs = append(errs, moe.FieldError{Field: "sharding", Value: l.Sharding, Allowed: "must be fsdp, zero2, zero1 or ddp"})
	}
	switch l.FSDPImpl {
	case "", FSDPTorch:
	case FSDPMegatron:
		if l.Sharding != ShardFSDP {
			errs = append(errs, moe.FieldError{Field: "fsdp_impl", Value: l.FSDPImpl, Allowed: fmt.Sprintf("needs sharding fsdp (Megatron's optim_grads_params), not %s", l.Sharding)})
		}
		if l.PP > 1 {
			errs = append(errs, moe.FieldError{Field: "fsdp_impl", Value: l.FSDPImpl, Allowed: fmt.Sprintf("with pp = %d is not modelled (only fsdp2 inside pipeline stages)", l.PP)})
		}
		if l.DPReplicate > 1 {
			// fully_sharded_data_parallel.py: "TODO: add hybrid FSDP".
			errs = append(errs, moe.FieldError{Field: "fsdp_impl", Value: l.FSDPImpl, Allowed: fmt.Sprintf("with dp_replicate = %d: Megatron-LM 1e057005's FSDP has no hybrid (replicated) sharding", l.DPReplicate)})
		}
		if l.GradSyncLastOnly || l.KeepGathered || !l.ReshardAfterForward {
			errs = append(errs, moe.FieldError{Field: "fsdp_impl", Value: l.FSDPImpl, Allowed: "reduces gradients every micro-step and frees a layer's weights after its forward and its backward: grad_sync_last_only and keep_gathered must be false, reshard_after_forward true"})
		}
	default:
		errs = append(errs, moe.FieldError{Field: "fsdp_impl", Value: l.FSDPImpl, Allowed: "must be fsdp2 or megatron"})
	}
	if l.GradSyncLastOnly && l.Sharding == ShardZeRO2 {
		errs = append(errs, moe.FieldError{Field: "grad_sync_last_only", Value: true, Allowed: "needs sharding fsdp (FSDP2's set_requires_gradient_sync), zero1 or ddp (whole gradients kept: DDP's and Megatron-Core's no_sync), not zero2"})
	}
	if l.GPUsPerNode < 0 || l.GPUsPerNode > MaxGPUsPerNode {
		errs = append(errs, moe.FieldError{Field: "gpus_per_node", Value: l.GPUsPerNode, Allowed: fmt.Sprintf("must be in [1, %d] (0 = from the cluster)", MaxGPUsPerNode)})
	}
	return errors.Join(errs...)
}

// CheckModel checks the layout against a model: experts must divide by EP,
// tp must divide every dimension it splits (torchtitan's column-wise
// q/k/v cut whole heads; its row-wise and column-wise FFNs cut the widths),
// and the pipeline's stages must split the model's layers (StageSplit).
// Under TP, MLA attention and a q/k norm over all heads are refused: they
// are not part of the plan torchtitan applies to the models moescope runs.
func (l Layout) CheckModel(c *moe.Config) error {
	var errs []error
	if l.EP > 1 && (c.Experts == 0 || c.Experts%l.EP != 0) {
		errs = append(errs, fmt.Errorf("ep = %d does not divide experts = %d", l.EP, c.Experts))
	}
	if tp := l.TPDegree(); tp > 1 {
		if c.IsMLA() {
			errs = append(errs, fmt.Errorf("tp = %d with MLA attention is not built (tp > 1 needs multi-head or grouped-query attention)", tp))
		}
		if c.QKNorm == moe.QKNormFull {
			errs = append(errs, fmt.Errorf("tp = %d with a q/k norm over all heads (qk_norm full) is not built: it would need the heads of every tp rank", tp))
		}
		for _, d := range []struct {
			name string
			n    int
			on   bool
		}{
			{"heads", c.Heads, !c.IsMLA()},
			{"kv_heads", c.KVHeads, !c.IsMLA()},
			{"dense_ffn", c.DenseFFN, c.MoELayers() < c.Layers},
			{"shared_experts × shared_ffn", c.SharedExperts * c.SharedFFN, c.IsMoE() && c.SharedExperts > 0},
		} {
			if d.on && d.n%tp != 0 {
				errs = append(errs, fmt.Errorf("tp = %d does not divide %s = %d", tp, d.name, d.n))
			}
		}
	}
	if et := l.ExpertTP(); et > 1 && c.IsMoE() && c.ExpertFFN%et != 0 {
		errs = append(errs, fmt.Errorf("expert tensor-parallel degree %d (tp = %d, etp = %d, ep = %d) does not divide expert_ffn = %d", et, l.TPDegree(), max(l.ETP, 1), l.EP, c.ExpertFFN))
	}
	if cp := l.CPDegree(); cp > 1 && c.IsMLA() {
		errs = append(errs, fmt.Errorf("cp = %d with MLA attention is not modelled yet (context parallelism is priced for multi-head and grouped-query attention)", cp))
	}
	if cp := l.CPDegree(); cp > 1 && slices.ContainsFunc(c.Window, func(w int) bool { return w > 0 }) {
		errs = append(errs, fmt.Errorf("cp = %d with sliding-window attention layers is not modelled yet (context parallelism is priced for full causal attention)", cp))
	}
	if cp := l.CPDegree(); cp > 1 && slices.ContainsFunc(c.Chunk, func(n int) bool { return n > 0 }) {
		errs = append(errs, fmt.Errorf("cp = %d with chunked attention layers (Llama 4's chunk) is not modelled yet (context parallelism is priced for full causal attention)", cp))
	}
	if _, err := l.StageSplit(c.Layers); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// CheckSeq checks a sequence length against the layout: with tp > 1
// torchtitan v0.2.2 (models/*/infra/parallelize.py) asserts that seq_len
// divides by ParallelDims.seq_len_divisor = tp·(2·cp), the sequence-parallel
// split times context parallelism's load-balanced halves (checkCPSeq).
func (l Layout) CheckSeq(seq int) error {
	if l.CPDegree() > 1 {
		return l.checkCPSeq(seq)
	}
	if tp := l.TPDegree(); tp > 1 && seq%(2*tp) != 0 {
		return fmt.Errorf("seq = %d is not divisible by tp × 2·cp = %d × 2·1 = %d (torchtitan's sequence-parallel requirement)", seq, tp, 2*tp)
	}
	return nil
}

// TPDegree is the tensor-parallel degree (TP, with 0 read as 1).
func (l Layout) TPDegree() int { return max(l.TP, 1) }

// DP is the data-parallel degree of one pipeline stage, dp_replicate ×
// dp_shard.
func (l Layout) DP() int { return l.DPReplicate * l.DPShard }

// ExpertTP is the degree routed experts' FFN width is split by: tp when
// ep = 1 (torchtitan applies TensorParallel to the experts on the tp mesh),
// etp otherwise (ExpertTensorParallel on the ep × etp mesh when etp = tp;
// whole experts, EP borrowing the tp ranks, when etp = 1).
func (l Layout) ExpertTP() int {
	if l.EP == 1 {
		return l.TPDegree()
	}
	return max(l.ETP, 1)
}

// ExpertShard is the FSDP degree of expert weights, efsdp =
// dp_shard·cp·tp/(ep·ExpertTP): dp_shard/ep without TP and CP, as
// torchtitan v0.2.2 builds its sparse mesh (with ep = 1 the experts are
// sharded with the dense weights over dp_shard·cp).
func (l Layout) ExpertShard() int {
	return l.DPShard * l.CPDegree() * l.TPDegree() / (l.EP * l.ExpertTP())
}

// TokensPerExpertRank is the divisor of a rank's tokens in the routed
// experts' region: tp when ep > 1 and etp = 1, where torchtitan's
// ReordererSequenceParallel splits the routed (token, expert) rows over the
// tp ranks that EP borrowed; 1 otherwise (each tp rank routes the whole
// gathered micro-batch).
func (l Layout) TokensPerExpertRank() int {
	if l.EP > 1 && l.ETP == 1 {
		return l.TPDegree()
	}
	return 1
}

// ppFactor, ppValue and ppWord print the pp factor of the world in
// messages ("pp × ", "4 × ", "pp 4 × "), nothing without pipeline
// parallelism.
func ppFactor(pp int) string {
	if pp > 1 {
		return "pp × "
	}
	return ""
}

func ppValue(pp int) string {
	if pp > 1 {
		return fmt.Sprintf("%d × ", pp)
	}
	return ""
}

// cpFactor and cpValue print the cp factor likewise.
func cpFactor(cp int) string {
	if cp > 1 {
		return "cp × "
	}
	return ""
}

func cpValue(cp int) string {
	if cp > 1 {
		return fmt.Sprintf("%d × ", cp)
	}
	return ""
}

func ppWord(pp int) string {
	if pp > 1 {
		return fmt.Sprintf("pp %d × ", pp)
	}
	return ""
}
