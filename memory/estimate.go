package memory

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/memory/verdict"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// Options are the choices besides model, layout and batch.
type Options struct {
	Precision moe.Precision // storage types; zero value means moe.DefaultPrecision
	// Master is the type of a master copy of the parameters kept with the
	// optimizer state and sharded like it ("" = none: the stored parameters
	// are the master copy, as in torchtitan). ZeRO's mixed-precision Adam is
	// Precision{Param: BF16, Grad: BF16, Optimizer: F32} with Master F32.
	Master    moe.DType
	AC        moe.AC    // checkpointing; zero value means none
	Attention Attention // "" means Flash
	// LossChunks > 1 computes logits, loss and their gradients chunk by chunk
	// over tokens (each chunk checkpointed): the head keeps no
	// log-probabilities, only the final norm's tensors, the LM-head input and
	// the labels (the chunks' checkpoint inputs).
	LossChunks int
	// OptimizerImpl is the AdamW implementation: "fused" (torchtitan's
	// default since 2025: no temporaries) or "foreach" (torch's
	// _multi_tensor_adamw, torchtitan's default before: sqrt(v) is
	// materialized for every local element during the step). "" means fused.
	OptimizerImpl string
	// Compile is what torch.compile compiles. The zero value is eager,
	// unlike the command line, which compiles by default as torchtitan's
	// --compile does: OptionsOf(job.DefaultRecipe(), ac) gives the CLI's
	// defaults.
	Compile Compile
	// LossDType is the type the eager cross-entropy computes in: "" or F32
	// for torchtitan's pred.float(); the activation type for a loss that
	// does not upcast. A compiled loss fuses the upcast either way.
	LossDType moe.DType
	// ReduceDType is FSDP2's MixedPrecisionPolicy.reduce_dtype, the type
	// gradients are reduce-scattered in and, under grad-sync-last-only,
	// accumulated in across micro-steps when it differs from the compute
	// type ("" = Precision.Grad: torchtitan reduces in fp32 into fp32
	// gradients; KempnerForge reduces in fp32 into bf16 ones).
	ReduceDType moe.DType
	// Segments is the caching allocator's segment mode: "" or Expandable
	// (PYTORCH_ALLOC_CONF=expandable_segments:True, which torchtitan's
	// run_train.sh sets), or Fixed (PyTorch's default without it).
	Segments  Segments
	Allocator *Allocator // nil means DefaultAllocator
	// FP8Gather names the GEMM sets whose weights FSDP all-gathers in fp8
	// (torchao's float8 all-gather: job.Recipe.GathersFP8): Unit.Linear
	// and Unit.Output elements take one byte where the compute type takes
	// its own.
	FP8Gather struct{ Linear, Output bool }
	// GradBuffer: Megatron-Core's contiguous gradient buffer holds the
	// gradients (job.MegatronDDP, gradbuffer.go); sharding zero1 or ddp.
	GradBuffer bool
	// TE says which parts of the step are TransformerEngine's and how its
	// modules store their saved inputs (te.go); zero value: none.
	TE TE
	// AutoModel says the blocks and trainer are NeMo AutoModel's
	// (automodel.go); zero value: torchtitan's.
	AutoModel AutoModel
	// ExpertLoad is the most loaded expert-parallel rank's rows ÷ the
	// mean (Shape.ExpertLoad): the step is that rank's.
	ExpertLoad float64
	// RouterCV > 0 is learned routing: the router's per-expert load spread
	// (band.Stored.RouterCV), from which Estimate sets ExpertLoad to the
	// run's job.Spec.LearnedSkew.
	RouterCV float64
	// CUDAGraphs: the captured CUDA graphs' static buffers are held (graphs.go).
	CUDAGraphs job.CUDAGraphs
	// Delayed is the recipe when it is fp8-delayed, whose amax histories
	// the rank keeps (amax.go); zero value: none.
	Delayed job.Recipe
}

// Segments is the caching allocator's segment mode.
type Segments string

// Segment modes.
const (
	Expandable Segments = "expandable"
	Fixed      Segments = "fixed"
)

// AdamW implementations.
const (
	Fused   = "fused"
	Foreach = "foreach"
)

// Batch is what one data-parallel rank processes per step: the run
// description's (job.Batch, whose Validate holds the one set of limits;
// GradAccum 0 reads as 1 here).
type Batch = job.Batch

// Report is the memory of one rank for one training step.
type Report struct {
	Units  []Unit
	State  State
	Saved  []int64 // saved-activation bytes per unit, in Units order
	Events []Event
	Peak   Peak
	// Under pipeline parallelism (pp > 1) the report is that of pipeline
	// rank Stage, the one with the highest peak reserved; Stages has every
	// rank's peak (pipeline.go). Stage is 0 and Stages nil otherwise.
	Stage  int
	Stages []StagePeak
}

// Breakdown is the integer byte counts reported by `moescope memory`: the
// live bytes of each category at the peak, plus the allocator overhead
// (peak reserved − peak allocated).
func (r Report) Breakdown() map[string]int64 {
	cats := Categories()
	b := make(map[string]int64, len(cats)+1)
	for _, c := range cats {
		b[string(c)] = r.Peak.Live[c]
	}
	b["allocator_overhead"] = r.Peak.Reserved - r.Peak.Allocated
	return b
}

func (o Options) normalized() (Options, error) {
	if o.Precision == (moe.Precision{}) {
		o.Precision = moe.DefaultPrecision
	}
	if o.AC.Mode == "" {
		o.AC = moe.AC{Mode: moe.ACNone}
	}
	if err := o.AC.Validate(); err != nil {
		return o, err
	}
	if o.Attention == "" {
		o.Attention = Flash
	}
	if o.Attention != Flash && o.Attention != Eager {
		return o, fmt.Errorf("attention = %q: must be flash or eager", o.Attention)
	}
	if o.LossChunks < 0 || o.LossChunks > 1<<20 {
		return o, fmt.Errorf("loss_chunks = %d: must be in [0, 1048576]", o.LossChunks)
	}
	switch o.OptimizerImpl {
	case "":
		o.OptimizerImpl = Fused
	case Fused, Foreach:
	default:
		return o, fmt.Errorf("optimizer implementation = %q: must be fused or foreach", o.OptimizerImpl)
	}
	switch o.Segments {
	case "":
		o.Segments = Expandable
	case Expandable, Fixed:
	default:
		return o, fmt.Errorf("segments = %q: must be expandable or fixed", o.Segments)
	}
	switch o.LossDType {
	case "":
		o.LossDType = moe.F32
	case moe.F32, moe.BF16, moe.F16:
	default:
		return o, fmt.Errorf("loss dtype = %q: must be f32, bf16 or f16", o.LossDType)
	}
	switch o.ReduceDType {
	case "":
		o.ReduceDType = o.Precision.Grad
	case moe.F32, moe.BF16, moe.F16:
	default:
		return o, fmt.Errorf("reduce dtype = %q: must be f32, bf16 or f16", o.ReduceDType)
	}
	if o.AC.Mode == moe.ACMemoryBudget && !o.Compile.Model { // as torchtitan b5bcd76 trainer.py refuses it
		return o, fmt.Errorf("ac = %s: torchtitan's memory-budget checkpointing needs the compiled model (compile components must include model)", o.AC)
	}
	if o.TE.Blocks && (o.AC.Mode == moe.ACSelective || o.Compile.Model) {
		return o, fmt.Errorf("transformer_impl transformer_engine: Megatron-Core's TE blocks take ac none, full, layer:N or modules:…, not selective, without a compiled model (not %s, compiled model %v)", o.AC.Mode, o.Compile.Model)
	}
	if o.TE.Loss && (o.Compile.Loss || o.LossChunks > 1) {
		return o, fmt.Errorf("loss_impl te: TransformerEngine's cross-entropy is neither compiled nor chunked (compiled loss %v, loss_chunks %d)", o.Compile.Loss, o.LossChunks)
	}
	if o.Allocator == nil {
		a := DefaultAllocator
		o.Allocator = &a
	}
	if err := o.Allocator.Validate(); err != nil {
		return o, err
	}
	return o, checkPrecision(o.Precision, o.Master)
}

func checkBatch(cfg *moe.Config, b Batch, attn Attention) (Batch, error) {
	if b.GradAccum == 0 {
		b.GradAccum = 1
	}
	if err := b.Validate(); err != nil {
		return b, err
	}
	// Every size is a product of T = lbs·seq and at most two model widths;
	// bound the largest sum in float64 before computing it in int64.
	T := float64(b.LBS) * float64(b.Seq)
	w := float64(max(cfg.Hidden*max(cfg.TopK, 1), cfg.TopK*cfg.ExpertFFN, cfg.Vocab, cfg.Experts,
		cfg.Heads*cfg.HeadDim, cfg.SharedExperts*cfg.SharedFFN, cfg.DenseFFN))
	if attn == Eager {
		w = max(w, float64(cfg.Heads)*float64(b.Seq))
	}
	if T*w*64*float64(cfg.Layers+2) > math.MaxInt64/4 {
		return b, fmt.Errorf("lbs = %d, seq = %d: %g tokens per micro-step make byte counts overflow int64", b.LBS, b.Seq, T)
	}
	return b, nil
}

// CheckOptions reports what Estimate refuses of options o under layout l
// before estimating anything: bad types, and the checkpointing policies,
// compilation and layouts a framework's modules are not modelled with
// (TE blocks, AutoModel), so that a search can skip such points.
func CheckOptions(l job.Layout, o Options) error {
	o, err := o.normalized()
	if err != nil {
		return err
	}
	return o.AutoModel.check(l, o)
}

// Estimate sizes one rank's memory for one training step of cfg under
// layout l: training state, saved activations, the step's allocation
// timeline and its peaks through the allocator model.
func Estimate(cfg *moe.Config, l job.Layout, b Batch, o Options) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	o, err := o.normalized()
	if err != nil {
		return Report{}, err
	}
	if b, err = checkBatch(cfg, b, o.Attention); err != nil {
		return Report{}, err
	}
	if err := l.CheckSeq(b.Seq); err != nil {
		return Report{}, err
	}
	method := l.CPMethod
	l, b, cp := foldCP(l, b)
	if o.RouterCV > 0 {
		o.ExpertLoad = job.Spec{Model: cfg, Layout: l, Batch: job.Batch{LBS: b.LBS, Seq: b.Seq, GradAccum: b.GradAccum}}.LearnedSkew(o.RouterCV)
	}
	if err := o.AutoModel.check(l, o); err != nil {
		return Report{}, err
	}
	if o.GradBuffer && l.Sharding != job.ShardZeRO1 && l.Sharding != job.ShardDDP {
		return Report{}, fmt.Errorf("ddp_impl megatron: Megatron-Core's gradient buffer needs sharding zero1 or ddp, not %s", l.Sharding)
	}
	if l.Stages() > 1 && o.CUDAGraphs.Captures(true) {
		return Report{}, fmt.Errorf("cuda_graphs = %s with pp = %d: graphs per stage and in-flight micro-batch are not modelled (torchtitan main's trainer.py refuses them too)", o.CUDAGraphs, l.Stages())
	}
	if l.Stages() > 1 {
		if err := l.Validate(); err != nil {
			return Report{}, err
		}
		return estimatePipeline(cfg, l, b, o, cpShape{cp, method})
	}
	units, err := Units(cfg, l)
	if err != nil {
		return Report{}, err
	}
	sh := stepShape(l, b, o)
	cpShape{cp, method}.set(&sh)
	r := Report{Units: units, State: StateOf(units, l.Sharding, o)}
	r.Events, r.Saved, err = buildTimeline(cfg, l, b, o, sh, units)
	if err != nil {
		return Report{}, err
	}
	if o.GradBuffer {
		r.Events = contiguousGrads(r.Events, r.State.Grads)
	}
	r.Events = withAmaxHistories(o, cfg, l, units, r.Events)
	r.Peak, err = Replay(r.Events, *o.Allocator, o.Segments)
	return r, err
}

// stepShape is the activation shape of a micro-step of b under layout l
// and options o (normalized): one pipeline micro-batch's when b is one.
func stepShape(l job.Layout, b Batch, o Options) Shape {
	return Shape{Batch: b.LBS, Seq: b.Seq, AC: o.AC, Attention: o.Attention, EP: l.EP, Act: o.Precision.Activation,
		Compile: o.Compile, LossDType: o.LossDType, TP: l.TPDegree(), ExpertTP: l.ExpertTP(), ExpertRows: l.TokensPerExpertRank(),
		TE: o.TE, AutoModel: o.AutoModel, ExpertLoad: o.ExpertLoad}
}

// MaxLBS returns the largest local batch whose peak reserved memory is at
// most target·deviceBytes, with its report; 0 and the report at the
// smallest local batch when even that does not fit. Only local batches the
// layout runs are searched (job.Layout.Microbatches: under pp a whole
// number of micro-batches the schedule accepts, at most
// job.MaxMicrobatches); the search ends at the largest lbs that Estimate
// accepts (lbs·seq ≤ 2³² and byte counts far from overflow).
//
// Peak memory grows with lbs, so the answer is the boundary between lbs
// that fit and lbs that do not. The search runs over every n ≥ 1 and
// evaluates the largest valid lbs ≤ n, which keeps "n fits" monotone in n
// through the holes of a pipeline's valid set. Peak reserved is close to
// affine in lbs: secant steps (the line through the last two estimates,
// aimed at the limit) land near the boundary, steps doubling away from the
// last estimate bracket it, and bisection finishes. It is not
// largest.Within, the planner's search over a bounded list, because its
// range runs to 2³²/seq local batches: galloping up from below never pays
// for the estimates of the largest (a pipeline's cost grows with its
// micro-batches), which largest.Within probes first when its line misses.
func MaxLBS(cfg *moe.Config, l job.Layout, seq, gradAccum int, o Options, deviceBytes int64, target float64) (int, Report, error) {
	if deviceBytes < 1 {
		return 0, Report{}, fmt.Errorf("device_bytes = %d: must be ≥ 1", deviceBytes)
	}
	if !(target > 0 && target <= 1) {
		return 0, Report{}, fmt.Errorf("memory_target = %v: must be in (0, 1]", target)
	}
	top := max(1, min(job.MaxTokens/max(seq, 1), job.MaxLBS))
	if l.Stages() > 1 {
		top = min(top, job.MaxMicrobatches*max(l.PPMicrobatchSize, 1))
	}
	// valid is the largest lbs ≤ n the layout runs, 0 when there is none.
	// Above a pipeline's smallest valid lbs its holes are shorter than pp
	// micro-batches (the interleaved schedules' rounds), so the scan is
	// short.
	valid := func(n int) int {
		for ; n >= 1; n-- {
			if _, err := l.Microbatches(n); err == nil {
				return n
			}
		}
		return 0
	}
	first := l.MinLBS()
	if first == 0 || first > top {
		_, err := l.Microbatches(1)
		return 0, Report{}, fmt.Errorf("max lbs: no local batch up to %d is one the layout runs: %w", top, err)
	}
	limit := int64(target * float64(deviceBytes))
	at := func(lbs int) (Report, bool, error) {
		r, err := Estimate(cfg, l, Batch{LBS: lbs, Seq: seq, GradAccum: gradAccum}, o)
		return r, err == nil && verdict.WithinTarget(float64(r.Peak.Reserved)/float64(deviceBytes), target), err
	}
	r1, ok, err := at(first)
	if err != nil || !ok {
		return 0, r1, err
	}
	// lo fits and hi does not (n standing for valid(n)); top+1 stands for
	// "none known", an lbs whose estimate fails (overflow) counts as not
	// fitting.
	lo, best, hi := first, r1, top+1
	// probe estimates valid(n) (≥ first, as n > lo), narrows [lo, hi) and
	// returns its peak reserved bytes, or -1 when the estimate fails.
	probe := func(n int) int64 {
		r, ok, err := at(valid(n))
		if ok {
			lo, best = n, r
		} else {
			hi = n
		}
		if err != nil {
			return -1
		}
		return r.Peak.Reserved
	}
	pa, ma := first, r1.Peak.Reserved // the previous estimate
	pb, mb := first, ma               // the last estimate
	for n, i := first+1, 0; i < 8 && lo < n && n < hi; i++ {
		m := probe(n)
		if m < 0 {
			pb = n
			break
		}
		pa, ma, pb, mb = pb, mb, n, m
		if mb <= ma {
			break // no slope to follow
		}
		next := float64(pb) + float64(limit-mb)*float64(pb-pa)/float64(mb-ma)
		n = int(min(max(next, float64(lo+1)), float64(hi-1)))
	}
	// pb is lo or hi: gallop away from it until the other side is found.
	up := pb == lo
	for step := 1; hi-lo > 1; step *= 2 {
		n := hi - step
		if up {
			n = lo + step
		}
		n = min(max(n, lo+1), hi-1)
		probe(n)
		if (n == lo) != up {
			break
		}
	}
	for hi-lo > 1 {
		probe(lo + (hi-lo)/2)
	}
	return valid(lo), best, nil
}
