package job

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/moescope/moescope/moe"
)

// Pipeline parallelism follows torchtitan and PyTorch's
// torch.distributed.pipelining, read at pinned commits:
//   - torchtitan 02ef790c79614758f85880e173d2338d7de502a3,
//     torchtitan/distributed/pipeline_parallel.py (pipeline_llm: stages per
//     rank, 1 for single-stage schedules and 2 by default for multi-stage
//     ones; generate_llm_fqn_per_model_part: the default layer split;
//     pipeline_module_split: stage s of a looped schedule lives on rank
//     s mod pp; build_pipeline_schedule: micro-batches = local batch ÷
//     pipeline_parallel_microbatch_size) and torchtitan/config/job_config.py
//     (pipeline_parallel_schedule = "1F1B", microbatch size 1,
//     first/last_stage_less_layers = 1);
//   - PyTorch 00722e648b740f91d0e71494baa17891749fd291,
//     torch/distributed/pipelining/schedules.py (ScheduleGPipe,
//     Schedule1F1B, ScheduleInterleaved1F1B with _get_1f1b_rank_ops and
//     _get_warmup_ops; ScheduleInterleavedZeroBubble, the same with
//     enable_zero_bubble and a warm-up of one forward per hop;
//     ScheduleZBVZeroBubble's _calculate_single_rank_operations; the
//     action kinds of _ComputationType) and stage.py
//     (backward_one_chunk: the first stage's backward-input pass does
//     nothing, its backward-weight pass runs the whole backward);
//   - torchtitan b5bcd76c66d0acb1a08b176d9639425bc55e0b2a (the pinned
//     02ef790c is not in the mirror read),
//     torchtitan/distributed/pipeline_parallel.py
//     (_get_pp_rank_to_stage_indices_mapping: style "v" for ZBVZeroBubble
//     and DualPipeV, rank r holding stages r and 2·pp − 1 − r, exactly two
//     per rank; "loop" otherwise).

// PPSchedule names a pipeline schedule as torchtitan's
// pipeline_parallel_schedule does (PyTorch's class name without
// "Schedule").
type PPSchedule string

// Pipeline schedules moescope builds.
const (
	PPGPipe           PPSchedule = "GPipe"           // all forwards, then all backwards
	PP1F1B            PPSchedule = "1F1B"            // one forward, one backward in steady state
	PPInterleaved1F1B PPSchedule = "Interleaved1F1B" // 1F1B over several looped stages per rank
	// PPInterleavedZeroBubble is ZB1P (Qi et al. 2024): Interleaved1F1B
	// with backward split into input and weight passes, the weight passes
	// filling the bubbles.
	PPInterleavedZeroBubble PPSchedule = "InterleavedZeroBubble"
	// PPZBVZeroBubble is ZB-V: two stages per rank in a V (rank r holds
	// stages r and 2·pp − 1 − r), backward split into input and weight
	// passes.
	PPZBVZeroBubble PPSchedule = "ZBVZeroBubble"
	// PPDualPipeV is DeepSeek's DualPipe folded into a V (PyTorch's
	// ScheduleDualPipeV): ZB-V's placement, pairs of a forward of one
	// stage and a full backward of the other, zero-bubble passes at the
	// ends.
	PPDualPipeV PPSchedule = "DualPipeV"
)

// PPImpl names the pipeline implementation whose buffers a stage holds:
// the order of actions is the schedule's either way (Megatron-Core's 1F1B
// and interleaved schedules issue the orders PipelineOrder gives, see
// MegatronWarmup); what differs is the memory of the point-to-point
// transfers (the memory package's pipeline timeline).
type PPImpl string

// Pipeline implementations.
const (
	// PPTorch is PyTorch's torch.distributed.pipelining, as torchtitan
	// runs it: each stage allocates a receive buffer per micro-batch for
	// the whole step and keeps each forward's output until its backward.
	PPTorch PPImpl = "torch"
	// PPMegatron is Megatron-Core's own schedules and p2p
	// (megatron/core/pipeline_parallel/schedules.py and
	// p2p_communication.py at Megatron-LM
	// 0d8e0714cd29c01e164fe6de9f532182bdffa942, the Megatron-LM that
	// Megatron-Bridge v0.2.0, NeMo 25.11, pins): a receive buffer is
	// allocated per receive and held until the backward that uses it, and
	// a forward's output is pseudo-freed once sent
	// (deallocate_pipeline_outputs, on in Megatron-LM's training arguments
	// and Megatron-Bridge's GPTModelProvider).
	PPMegatron PPImpl = "megatron"
)

// PipelineImpl is the layout's pipeline implementation, PPTorch when
// PPImpl is left empty.
func (l Layout) PipelineImpl() PPImpl {
	if l.PPImpl == "" {
		return PPTorch
	}
	return l.PPImpl
}

// MegatronWarmup is the number of forwards pipeline rank r runs before its
// first steady-state (forward, backward) pair under Megatron-Core's
// schedule s (1F1B or Interleaved1F1B) with v model chunks and m
// micro-batches (schedules.py at the commit PPMegatron cites): 1F1B's
// min(pp − r − 1, m) (lines 2069-2072); the interleaved schedule's
// (pp − r − 1)·2 + (v − 1)·microbatch_group_size_per_vp_stage, capped at
// v·m (get_pp_rank_microbatches, 722-742), the group size defaulting to
// pp (model_parallel_config.py 399-400). These are the orders
// PipelineOrder gives: 1F1B's min(m, pp − r) leading forwards are the
// warm-up and the first steady forward, and with m a multiple of pp
// (Layout.Microbatches requires it under Megatron) PyTorch's
// Interleaved1F1B warm-up (v − 1)·k + 2·(pp − 1 − r) has k = m ÷ rounds =
// pp micro-batches per round, and Megatron's schedule table
// (get_schedule_table: groups of pp micro-batches, chunk by chunk) is the
// same order of stages and micro-batches.
func MegatronWarmup(s PPSchedule, r, pp, v, m int) int {
	if s == PPInterleaved1F1B {
		return min((pp-r-1)*2+(v-1)*pp, v*m)
	}
	return min(pp-r-1, m)
}

// PPSchedules lists the schedules built, in the order errors print them.
func PPSchedules() []PPSchedule {
	return []PPSchedule{PPGPipe, PP1F1B, PPInterleaved1F1B, PPInterleavedZeroBubble, PPZBVZeroBubble, PPDualPipeV}
}

// ppNotBuilt are torchtitan's other schedule names: refused until an issue
// builds them.
var ppNotBuilt = []PPSchedule{"LoopedBFS"}

// MultiStage reports whether the schedule runs several stages per rank
// (PyTorch's PipelineScheduleMulti).
func (s PPSchedule) MultiStage() bool {
	return s == PPInterleaved1F1B || s == PPInterleavedZeroBubble || s == PPZBVZeroBubble || s == PPDualPipeV
}

// VShaped reports whether the schedule places stages in a V (torchtitan's
// style "v"): exactly two stages per rank, r and 2·pp − 1 − r.
func (s PPSchedule) VShaped() bool { return s == PPZBVZeroBubble || s == PPDualPipeV }

// ZeroBubble reports whether the schedule splits backwards into their
// input (I) and weight (W) passes (DualPipeV some of them).
func (s PPSchedule) ZeroBubble() bool {
	return s == PPInterleavedZeroBubble || s == PPZBVZeroBubble || s == PPDualPipeV
}

// Check returns an error naming pp_schedule unless s is a schedule
// moescope builds (PPSchedules).
func (s PPSchedule) Check() error {
	for _, b := range PPSchedules() {
		if s == b {
			return nil
		}
	}
	built := fmt.Sprintf("one of %v", PPSchedules())
	for _, n := range ppNotBuilt {
		if s == n {
			return moe.FieldError{Field: "pp_schedule", Value: s, Allowed: "torchtitan's schedule is not built yet; built: " + built}
		}
	}
	return moe.FieldError{Field: "pp_schedule", Value: s, Allowed: "must be " + built}
}

// StageLayers is an explicit split of the transformer layers over the
// pipeline stages (pp × virtual stages, in stage order): decimal counts
// joined by commas, "10,12,12". It is a string so that Layout stays
// comparable; JSON reads and writes it as a list of integers.
type StageLayers string

// maxStageLayers bounds one stage's count (a moe.Config has at most moe.MaxDim
// layers).
const maxStageLayers = moe.MaxDim

// Counts parses the split; "" is no explicit split (nil).
func (s StageLayers) Counts() ([]int, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(string(s), ",")
	if len(parts) > MaxDegree {
		return nil, moe.FieldError{Field: "pp_layers", Value: fmt.Sprintf("%d stages", len(parts)), Allowed: fmt.Sprintf("at most %d stages", MaxDegree)}
	}
	out := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > maxStageLayers || strconv.Itoa(n) != p {
			return nil, moe.FieldError{Field: "pp_layers", Value: string(s), Allowed: fmt.Sprintf("stage %d = %q: each must be a layer count in [0, %d], comma-separated", i, p, maxStageLayers)}
		}
		out[i] = n
	}
	return out, nil
}

// NewStageLayers joins counts into a StageLayers.
func NewStageLayers(counts []int) StageLayers {
	parts := make([]string, len(counts))
	for i, c := range counts {
		parts[i] = strconv.Itoa(c)
	}
	return StageLayers(strings.Join(parts, ","))
}

// MarshalJSON writes the split as a list of integers.
func (s StageLayers) MarshalJSON() ([]byte, error) {
	c, err := s.Counts()
	if err != nil {
		return nil, err
	}
	if c == nil {
		c = []int{}
	}
	return json.Marshal(c)
}

// UnmarshalJSON reads a list of integers (null is no split).
func (s *StageLayers) UnmarshalJSON(b []byte) error {
	var c []int
	if err := json.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("pp_layers: want a list of layer counts: %w", err)
	}
	*s = NewStageLayers(c)
	_, err := s.Counts()
	return err
}

// Stages is the pipeline-parallel degree: PP, or 1 when PP is 0.
func (l Layout) Stages() int { return max(l.PP, 1) }

// VirtualStages is the number of pipeline stages per rank: PPVirtualStages,
// or 1 when it is 0.
func (l Layout) VirtualStages() int { return max(l.PPVirtualStages, 1) }

// PipelineStages is the number of model chunks, pp × virtual stages.
func (l Layout) PipelineStages() int { return l.Stages() * l.VirtualStages() }

// resolvePipeline fills the pipeline options of a layout with pp > 1:
// torchtitan's defaults (schedule 1F1B, one sequence per micro-batch, one
// stage per rank for single-stage schedules and two for multi-stage ones)
// and, with an explicit split, the virtual stages it implies.
func (l *Layout) resolvePipeline() error {
	if l.Stages() == 1 {
		return nil
	}
	if l.PPSchedule == "" {
		l.PPSchedule = PP1F1B
	}
	if l.PPMicrobatchSize == 0 {
		l.PPMicrobatchSize = 1
	}
	if l.PPVirtualStages == 0 {
		counts, err := l.PPLayers.Counts()
		switch {
		case err != nil:
			return err
		case counts != nil:
			if len(counts)%l.PP != 0 {
				return fmt.Errorf("pp_layers has %d stages, not a multiple of pp = %d (gpus = %d = pp %d × dp_replicate %d × dp_shard %d)",
					len(counts), l.PP, l.GPUs, l.PP, l.DPReplicate, l.DPShard)
			}
			l.PPVirtualStages = len(counts) / l.PP
		case l.PPSchedule.MultiStage():
			l.PPVirtualStages = 2
		default:
			l.PPVirtualStages = 1
		}
	}
	return nil
}

// maxMicrobatchSize bounds pp_microbatch_size (sequences), like the
// planner's largest local batch.
const maxMicrobatchSize = 1 << 16

// validatePipeline checks the pipeline options (Validate).
func (l Layout) validatePipeline() []error {
	var errs []error
	if l.PP < 0 || l.PP > MaxDegree {
		return []error{moe.FieldError{Field: "pp", Value: l.PP, Allowed: fmt.Sprintf("must be in [1, %d] (0 = 1)", MaxDegree)}}
	}
	if l.Stages() == 1 {
		for _, f := range []struct {
			name string
			set  bool
			v    any
		}{{"pp_schedule", l.PPSchedule != "", l.PPSchedule}, {"pp_microbatch_size", l.PPMicrobatchSize != 0, l.PPMicrobatchSize},
			{"pp_virtual_stages", l.PPVirtualStages != 0, l.PPVirtualStages}, {"pp_layers", l.PPLayers != "", l.PPLayers},
			{"pp_impl", l.PPImpl != "" && l.PPImpl != PPTorch, l.PPImpl}} {
			if f.set {
				errs = append(errs, moe.FieldError{Field: f.name, Value: f.v, Allowed: "a pipeline option needs pp > 1"})
			}
		}
		return errs
	}
	if err := l.PPSchedule.Check(); err != nil {
		errs = append(errs, err)
	}
	// Async TP is accepted with pp > 1, as torchtitan accepts it: its
	// pipeline_llm applies the model's parallelize function, async TP
	// included, to each stage's model chunk (v0.2.2 73a0e6979dd1,
	// torchtitan/distributed/pipeline_parallel.py; main b5bcd76c66d0 the
	// same, with async TP under the compile settings). Its need of
	// torch.compile is checked where compile is known (the simulator, the
	// exports), as the layout does not hold it.
	if l.GradSyncLastOnly {
		// PyTorch's stage reduces after each schedule step's last backward;
		// skipping whole micro-steps on top is not modelled.
		errs = append(errs, moe.FieldError{Field: "grad_sync_last_only", Value: true, Allowed: "not modelled with pp > 1 (the pipeline already reduces once per micro-step)"})
	}
	if l.PPMicrobatchSize < 1 || l.PPMicrobatchSize > maxMicrobatchSize {
		errs = append(errs, moe.FieldError{Field: "pp_microbatch_size", Value: l.PPMicrobatchSize, Allowed: fmt.Sprintf("must be in [1, %d] sequences", maxMicrobatchSize)})
	}
	v := l.PPVirtualStages
	switch {
	case v < 1 || int64(v)*int64(l.PP) > MaxDegree:
		errs = append(errs, moe.FieldError{Field: "pp_virtual_stages", Value: v, Allowed: fmt.Sprintf("must be ≥ 1 with pp × pp_virtual_stages ≤ %d", MaxDegree)})
	case l.PPSchedule.VShaped() && v != 2:
		// torchtitan's _get_pp_rank_to_stage_indices_mapping and PyTorch's
		// ScheduleZBVZeroBubble: "v schedules assume 2 stages per rank".
		errs = append(errs, moe.FieldError{Field: "pp_virtual_stages", Value: v, Allowed: fmt.Sprintf("must be 2 for the V-shaped schedule %s (rank r holds stages r and 2·pp − 1 − r; pp = %d)", l.PPSchedule, l.PP)})
	case l.PPSchedule.MultiStage() && v < 2:
		// torchtitan's pipeline_llm: "Multi-stage schedule requires at
		// least 2 stages per rank".
		errs = append(errs, moe.FieldError{Field: "pp_virtual_stages", Value: v, Allowed: fmt.Sprintf("must be ≥ 2 for the multi-stage schedule %s", l.PPSchedule)})
	case !l.PPSchedule.MultiStage() && l.PPSchedule.Check() == nil && v != 1:
		errs = append(errs, moe.FieldError{Field: "pp_virtual_stages", Value: v, Allowed: fmt.Sprintf("must be 1 for the single-stage schedule %s", l.PPSchedule)})
	}
	errs = append(errs, l.validatePPImpl()...)
	counts, err := l.PPLayers.Counts()
	switch {
	case err != nil:
		errs = append(errs, err)
	case counts != nil && len(counts) != l.PP*v:
		errs = append(errs, moe.FieldError{Field: "pp_layers", Value: l.PPLayers, Allowed: fmt.Sprintf("must list pp × pp_virtual_stages = %d × %d = %d stages", l.PP, v, l.PP*v)})
	}
	return errs
}

// validatePPImpl checks pp_impl with pp > 1. Megatron-Core runs
// forward_backward_pipelining_without_interleaving (1F1B) or, with
// virtual stages, forward_backward_pipelining_with_interleaving
// (Interleaved1F1B) (schedules.py's get_forward_backward_func at the
// commit PPMegatron cites); its stages hold their whole weights, under
// DDP with or without the distributed optimizer (zero1): FSDP inside a
// Megatron pipeline is not modelled.
func (l Layout) validatePPImpl() []error {
	switch l.PPImpl {
	case "", PPTorch:
		return nil
	case PPMegatron:
		var errs []error
		if l.PPSchedule != PP1F1B && l.PPSchedule != PPInterleaved1F1B {
			errs = append(errs, moe.FieldError{Field: "pp_impl", Value: l.PPImpl, Allowed: fmt.Sprintf("needs pp_schedule 1F1B or Interleaved1F1B, Megatron-Core's schedules (not %s)", l.PPSchedule)})
		}
		if l.Sharding != ShardZeRO1 && l.Sharding != ShardDDP {
			errs = append(errs, moe.FieldError{Field: "pp_impl", Value: l.PPImpl, Allowed: fmt.Sprintf("needs sharding zero1 or ddp (Megatron's DDP, with or without its distributed optimizer), not %s", l.Sharding)})
		}
		return errs
	}
	return []error{moe.FieldError{Field: "pp_impl", Value: l.PPImpl, Allowed: "must be torch or megatron"}}
}

// StageSplit returns how many transformer layers each pipeline stage
// holds, in stage order (pp × virtual stages entries; one entry, all
// layers, without pipeline parallelism). Stage 0 also holds the
// embedding, the last stage the final norm and the LM head. An explicit
// PPLayers must sum to layers; otherwise the split is torchtitan's
// generate_llm_fqn_per_model_part with the embedding and the output each
// counted as one layer: layers + 2 effective layers spread evenly, the
// remainder one each to the first stages, then one effective layer taken
// from the first stage and one from the last.
func (l Layout) StageSplit(layers int) ([]int, error) {
	n := l.PipelineStages()
	counts, err := l.PPLayers.Counts()
	if err != nil {
		return nil, err
	}
	if counts != nil {
		sum := 0
		for s, c := range counts {
			if c == 0 && s > 0 && s < len(counts)-1 {
				return nil, moe.FieldError{Field: "pp_layers", Value: l.PPLayers, Allowed: fmt.Sprintf("stage %d holds no layer: only the first and last stages may (they hold the embedding and the head)", s)}
			}
			sum += c
		}
		if sum != layers {
			return nil, moe.FieldError{Field: "pp_layers", Value: l.PPLayers, Allowed: fmt.Sprintf("must sum to the model's %d layers (sums to %d)", layers, sum)}
		}
		return counts, nil
	}
	if n == 1 {
		return []int{layers}, nil
	}
	const inputWeight, outputWeight = 1, 1 // first/last_stage_less_layers
	eff := layers + inputWeight + outputWeight
	per, extra := eff/n, eff%n
	if per < max(inputWeight, outputWeight) {
		return nil, fmt.Errorf("pp × pp_virtual_stages = %d × %d = %d stages for %d layers + embedding + output: torchtitan's split needs at least one effective layer per stage and the embedding and output weights (1 each) within the smallest stage (%d); give fewer stages or --pp-layers",
			l.Stages(), l.VirtualStages(), n, layers, per)
	}
	out := make([]int, n)
	for s := range out {
		out[s] = per
		if s < extra {
			out[s]++
		}
	}
	out[0] -= inputWeight
	out[n-1] -= outputWeight
	return out, nil
}

// StageRank is the pipeline rank that runs stage s: looped placement,
// stage s on rank s mod pp (torchtitan's pipeline_module_split, style
// "loop"), or for V-shaped schedules stage s < pp on rank s and stage
// s ≥ pp on rank 2·pp − 1 − s (style "v").
func (l Layout) StageRank(s int) int { return stageRank(l.PPSchedule, l.Stages(), s) }

func stageRank(sch PPSchedule, pp, s int) int {
	if sch.VShaped() && s >= pp {
		return 2*pp - 1 - s
	}
	return s % pp
}

// RankStages lists the stages pipeline rank r runs, in local order (its
// k-th stage is r + k·pp looped, or r then 2·pp − 1 − r in a V).
func (l Layout) RankStages(r int) []int {
	pp, v := l.Stages(), l.VirtualStages()
	out := make([]int, v)
	for k := range out {
		out[k] = r + k*pp
	}
	if l.PPSchedule.VShaped() && v == 2 {
		out[1] = 2*pp - 1 - r
	}
	return out
}

// MaxMicrobatches bounds the pipeline micro-batches of one micro-step:
// the per-stage memory timeline and the pipeline program grow with them,
// and published pipelines run at most a few hundred per flush (Megatron's
// Qwen3-235B-A22B on 256 GB200: 256).
const MaxMicrobatches = 1 << 12

// Microbatches returns the pipeline micro-batches of one accumulation
// micro-step of lbs sequences per data-parallel rank: lbs ÷
// pp_microbatch_size (torchtitan's build_pipeline_schedule requires it to
// divide); 1 without pipeline parallelism. Interleaved1F1B and
// InterleavedZeroBubble also need the count to be a multiple of their
// rounds, max(1, m ÷ pp) (PyTorch's ScheduleInterleaved1F1B and
// ScheduleInterleavedZeroBubble); DualPipeV needs at least 2·pp (PyTorch's
// ScheduleDualPipeV: "at least as many microbatches as stages").
func (l Layout) Microbatches(lbs int) (int, error) {
	if l.Stages() == 1 {
		return 1, nil
	}
	mbs := l.PPMicrobatchSize
	if mbs < 1 {
		return 0, moe.FieldError{Field: "pp_microbatch_size", Value: mbs, Allowed: "must be ≥ 1 (resolve the layout first)"}
	}
	if lbs < 1 || lbs%mbs != 0 {
		return 0, fmt.Errorf("lbs = %d is not a multiple of pp_microbatch_size = %d (pipeline micro-batches per micro-step = lbs ÷ pp_microbatch_size)", lbs, mbs)
	}
	m := lbs / mbs
	if m > MaxMicrobatches {
		return 0, fmt.Errorf("lbs ÷ pp_microbatch_size = %d ÷ %d = %d pipeline micro-batches per micro-step: at most %d (use --grad-accum for more)", lbs, mbs, m, MaxMicrobatches)
	}
	if l.PPSchedule == PPInterleaved1F1B || l.PPSchedule == PPInterleavedZeroBubble {
		if rounds := max(1, m/l.PP); m%rounds != 0 {
			return 0, fmt.Errorf("lbs ÷ pp_microbatch_size = %d ÷ %d = %d micro-batches: %s needs a multiple of its rounds max(1, micro-batches ÷ pp) = %d",
				lbs, mbs, m, l.PPSchedule, rounds)
		}
	}
	if l.PPImpl == PPMegatron && l.PPSchedule == PPInterleaved1F1B && m%l.PP != 0 {
		// schedules.py (the commit PPMegatron cites, lines 975-995): the
		// group of pp micro-batches per virtual stage must not exceed m, and
		// m's remainder by it must be 0 or at least pp.
		return 0, fmt.Errorf("lbs ÷ pp_microbatch_size = %d ÷ %d = %d micro-batches: Megatron-Core's interleaved schedule needs a multiple of pp = %d",
			lbs, mbs, m, l.PP)
	}
	if l.PPSchedule == PPDualPipeV && m < 2*l.PP {
		return 0, fmt.Errorf("lbs ÷ pp_microbatch_size = %d ÷ %d = %d micro-batches: %s needs at least as many as stages, 2 × pp = 2 × %d = %d",
			lbs, mbs, m, l.PPSchedule, l.PP, 2*l.PP)
	}
	return m, nil
}

// MinLBS is the smallest local batch the layout runs (Microbatches
// accepts it): one sequence without pipeline parallelism, else the fewest
// whole micro-batches its schedule takes (DualPipeV: 2·pp); 0 for an
// unresolved layout.
func (l Layout) MinLBS() int {
	if l.Stages() == 1 {
		return 1
	}
	for m := 1; m <= MaxMicrobatches; m++ {
		if _, err := l.Microbatches(m * l.PPMicrobatchSize); err == nil {
			return m * l.PPMicrobatchSize
		}
	}
	return 0
}
