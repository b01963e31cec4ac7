package plan

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// Exports of a plan as torchtitan configuration. Two targets, each pinned to
// the torchtitan commit whose schema it was written against (excerpts of
// both schemas are kept in testdata/torchtitan/ and the tests check every
// key against them):
//
//   - TOML: the job-config files read by torchtitan releases before the
//     2026-02 configuration refactor, pinned to v0.2.2
//     (TorchtitanTOMLCommit, torchtitan/config/job_config.py). Batch fields
//     count sequences: global_batch_size = local_batch_size × data-parallel
//     degree × gradient-accumulation steps (torchtitan/train.py).
//   - Python: a config-registry function for current torchtitan, pinned to
//     TorchtitanPyCommit (torchtitan/config/configs.py,
//     torchtitan/distributed/activation_checkpoint.py). Batch fields count
//     tokens: num_tokens_per_microbatch_per_dp_rank = lbs × seq,
//     num_tokens_per_train_step = global batch × seq.
//
// Neither target has a field for ZeRO-1/2 sharding, for keeping weights
// gathered between backward and the next forward, or for skipping the
// replica all-reduce on non-final micro-steps; TorchtitanAdmit rejects
// such points (and those the target cannot run compiled, or eager) so the
// planner can keep to what the target expresses.
const (
	TorchtitanTOMLTag    = "v0.2.2"
	TorchtitanTOMLCommit = "73a0e6979dd10b6b1904098eb3c8f62c18ab87ce" // v0.2.2, 2026-02-20
	TorchtitanPyCommit   = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a" // main, 2026-08-21
)

// TorchtitanTarget is an export format.
type TorchtitanTarget int

// Export targets.
const (
	TorchtitanTOML TorchtitanTarget = iota // TOML job config, v0.2.2
	TorchtitanPy                           // Python config-registry function, current main
)

func (t TorchtitanTarget) String() string {
	if t == TorchtitanTOML {
		return "torchtitan " + TorchtitanTOMLTag + " TOML"
	}
	return "torchtitan " + TorchtitanPyCommit[:7] + " Python config"
}

// torchtitanModel maps a built-in model to torchtitan's names for it: the
// TOML-era [model] name and flavor (the flavor keys of
// torchtitan/models/<name>/__init__.py at v0.2.2) and the current registry
// function (torchtitan/models/<name>/config_registry.py at main) with the
// arguments it passes its package's model_registry (registryArgs: an
// export that adds converters calls model_registry with them again). An
// empty registry function means current torchtitan ships none for it.
var torchtitanModel = map[string]struct{ name, flavor, registryModule, registryFunc, registryArgs string }{
	// config_registry.py at b5bcd76c: qwen3_30b_a3b calls
	// model_registry("30B-A3B"), llama3_8b model_registry("8B"),
	// deepseek_v3_16b model_registry("16B", attn_backend="flex").
	"qwen3-30b-a3b":   {"qwen3", "30B-A3B", "torchtitan.models.qwen3.config_registry", "qwen3_30b_a3b", `"30B-A3B"`},
	"qwen3-235b-a22b": {"qwen3", "235B-A22B", "", "", ""},
	"llama3-8b":       {"llama3", "8B", "torchtitan.models.llama3.config_registry", "llama3_8b", `"8B"`},
	// torchtitan's deepseek_v3 "16B" flavor is its DeepSeek-MoE-16B
	// (train_configs/deepseek_v3_16b.toml loads deepseek-moe-16b-base).
	"deepseek-moe-16b": {"deepseek_v3", "16B", "torchtitan.models.deepseek_v3.config_registry", "deepseek_v3_16b", `"16B", attn_backend="flex"`},
	// gptoss_configs "20b" and "120b" (torchtitan/models/gpt_oss/__init__.py
	// at v0.2.2 and b5bcd76c); config_registry.py at b5bcd76c: gpt_oss_20b
	// and gpt_oss_120b call model_registry("20b") and model_registry("120b").
	"gpt-oss-20b":  {"gpt_oss", "20b", "torchtitan.models.gpt_oss.config_registry", "gpt_oss_20b", `"20b"`},
	"gpt-oss-120b": {"gpt_oss", "120b", "torchtitan.models.gpt_oss.config_registry", "gpt_oss_120b", `"120b"`},
	// llama4_args "17bx16e_irope" and "17bx128e_irope" at v0.2.2; main has
	// no Llama 4 (torchtitan_llama4.go).
	"llama-4-scout":    {"llama4", "17bx16e_irope", "", "", ""},
	"llama-4-maverick": {"llama4", "17bx128e_irope", "", "", ""},
}

// TorchtitanAdmit returns nil when target can express p run with a
// compiled model (compiledModel) or eager, else an error joining one error
// per field it cannot export.
//
// Two refusals depend on compiledModel: async TP is an Inductor pass
// (v0.2.2 parallelize_qwen3: "Async TP requires torch.compile"), and
// v0.2.2's apply_compile wraps each block in torch.compile (an
// OptimizedModule; torchtitan 73a0e6979dd1,
// models/llama3/infra/parallelize.py), which PyTorch's zero-bubble
// schedules refuse (schedules.py at 00722e64,
// _check_torch_compile_compatibility); main compiles the blocks in place
// (module.compile()).
func TorchtitanAdmit(target TorchtitanTarget, p Point, compiledModel bool) error {
	l := p.Layout
	var errs []error
	switch {
	case l.Sharding == job.ShardZeRO1 || l.Sharding == job.ShardZeRO2:
		errs = append(errs, fmt.Errorf("sharding = %s: %s has no field for it (FSDP2 shards parameters, gradients and optimizer state together)", l.Sharding, target))
	case l.Sharding == job.ShardDDP && l.DPShard > 1:
		errs = append(errs, fmt.Errorf("sharding = ddp with dp_shard = %d: %s expresses DDP only as data_parallel_shard_degree = 1", l.DPShard, target))
	}
	if l.KeepGathered {
		errs = append(errs, fmt.Errorf("keep_gathered = true: %s has no field for keeping weights gathered between backward and the next forward", target))
	}
	if l.AllreduceLastOnly {
		errs = append(errs, fmt.Errorf("allreduce_last_only = true: %s all-reduces replicas on every micro-step", target))
	}
	if l.GradSyncLastOnly {
		// torchtitan's trainer (pytorch/torchtitan at b5bcd76) never calls
		// set_requires_gradient_sync across micro-steps.
		errs = append(errs, fmt.Errorf("grad_sync_last_only = true: %s reduce-scatters gradients on every micro-step", target))
	}
	if p.AC.Mode == moe.ACModules {
		errs = append(errs, fmt.Errorf("ac = %s: %s has no module-level recompute (Megatron-Core's --recompute-modules)", p.AC, target))
	}
	if p.AC.Mode == moe.ACMemoryBudget && target == TorchtitanTOML {
		// v0.2.2 has mode = "memory_budget" (job_config.py), but compiles
		// MoE blocks submodule by submodule with the routed experts eager
		// (apply_compile), outside every partition; moescope's budget
		// follows main's whole-block graphs.
		errs = append(errs, fmt.Errorf("ac = %s: %s compiles MoE blocks by submodule with eager routed experts, which moescope's memory budget (main's whole-block compile) does not model; use the config-registry form", p.AC, target))
	}
	if p.AC.Mode == moe.ACMemoryBudget && !compiledModel {
		errs = append(errs, fmt.Errorf("ac = %s without a compiled model: %s refuses it (\"Memory budget activation checkpointing requires the model to be compiled\")", p.AC, target))
	}
	if p.AC.Mode == moe.ACLayer && target == TorchtitanPy {
		errs = append(errs, fmt.Errorf("ac = %s: %s has only per-op selective, full and no checkpointing", p.AC, target))
	}
	if l.EP > 1 && l.TPDegree() > 1 && l.ETP == l.TPDegree() && target == TorchtitanPy {
		// Main's ParallelDims has no etp: EP always borrows from
		// dp_shard·cp·tp (efsdp = dp_shard·cp·tp/ep), v0.2.2's etp = 1.
		errs = append(errs, fmt.Errorf("etp = tp = %d with ep = %d: %s has no expert_tensor_parallel_degree (its EP always borrows the tp ranks, etp = 1)", l.ETP, l.EP, target))
	}
	errs = append(errs, cpAdmit(target, l)...)
	if l.AsyncTP && l.TPDegree() > 1 && !compiledModel {
		errs = append(errs, fmt.Errorf("async_tp = true without a compiled model: %s refuses it (\"Async TP requires torch.compile\")", target))
	}
	if target == TorchtitanTOML && l.Stages() > 1 && l.PPSchedule.ZeroBubble() && compiledModel {
		way := "use --compile=false or the config-registry form"
		if l.AsyncTP && l.TPDegree() > 1 {
			// Eager is no way out: async TP is an Inductor pass.
			way = "async_tp needs the compiled model (\"Async TP requires torch.compile\"), so only the config-registry form expresses async TP with this schedule"
		}
		errs = append(errs, fmt.Errorf("pp_schedule = %s with a compiled model: %s cannot express it (its per-block torch.compile wrappers are refused by PyTorch's input/weight backward split); %s", l.PPSchedule, target, way))
	}
	return errors.Join(errs...)
}

// TorchtitanExport is a plan to export with what the files need besides it.
type TorchtitanExport struct {
	Model  string // moescope model name (a built-in name, or a path)
	Seq    int    // tokens per sequence
	Point  Point
	Header []string // comment lines written first (what was modelled)
	// Compile is what the plan's memory and time assumed torch.compile
	// compiles; the export sets torchtitan's compile section to match.
	Compile memory.Compile
	// Layers is the model's transformer layers, for a pipeline's layer
	// split (needed when pp > 1).
	Layers int
	// Precision is the storage types the plan's memory and time assumed
	// (the zero value is moe.DefaultPrecision) and ReduceDType the type
	// gradients are reduced in ("" = Precision.Grad), as memory.Options
	// has them; the export writes them or refuses (CheckPrecision).
	Precision   moe.Precision
	ReduceDType moe.DType
	// Quant is the low-precision recipe the plan assumed (the zero value
	// is bf16): the export writes its converters or refuses (CheckQuant,
	// AdmitQuant).
	Quant TorchtitanQuant
	// ForceBalance: the plan was priced with balanced routing stated
	// (--routing balanced), which torchtitan runs only under its debugging
	// option debug.moe_force_load_balance (round-robin; job_config.py
	// Debug at v0.2.2, configs.py DebugConfig at main): the export sets it.
	// Without it torchtitan's router is the learned one.
	ForceBalance bool
	// LossChunks is the chunked cross-entropy's chunk count the plan's
	// memory assumed (≤ 1: one piece). Only the Python export writes it
	// (v0.2.2 has no chunked loss; CheckRecipe refuses it there): main's
	// registry functions build a ChunkedLossWrapper of 8 chunks, so the
	// export always sets the loss the plan priced.
	LossChunks int
	// CUDAGraphs is the graphs the plan priced: the Python export sets
	// main's training.disable_cuda_graphs to match (pyGraphsLine); the
	// TOML export has none to write (CheckRecipe refuses graphs there).
	CUDAGraphs job.CUDAGraphs
	// Run, when set, makes the export a complete job config (the sweep's
	// jobs); nil writes the plan's fields only, to merge into a config.
	Run *TorchtitanRun
}

// torchtitanDTypes are the literals of both pinned forms' mixed-precision
// fields (training.mixed_precision_param: Literal["bfloat16", "float32"],
// mixed_precision_reduce: Literal["float32"]; Training in
// torchtitan/config/job_config.py at v0.2.2 73a0e6979dd1, TrainingConfig in
// torchtitan/config/configs.py at b5bcd76c).
var torchtitanDTypes = map[moe.DType]string{moe.BF16: "bfloat16", moe.F32: "float32"}

// CheckPrecision returns the literals target writes for the compute
// (all-gather) type and the reduce type of prec and reduce ("" =
// prec.Grad; a zero prec is moe.DefaultPrecision), or an error naming each
// type it cannot express. Both forms keep the sharded parameters, and with
// them the gradients (FSDP2's sharded gradients take the parameters' type)
// and AdamW's moments (torch.optim's zeros_like of the parameter), in
// fp32: their only other setting, training.dtype = "bfloat16", makes all
// three bf16 at once. And both reduce in fp32 only.
func (t TorchtitanTarget) CheckPrecision(prec moe.Precision, reduce moe.DType) (param, reduceLit string, err error) {
	if prec == (moe.Precision{}) {
		prec = moe.DefaultPrecision
	}
	if reduce == "" {
		reduce = prec.Grad
	}
	var errs []error
	if prec.Param != moe.F32 {
		errs = append(errs, fmt.Errorf("param dtype = %s: %s keeps fp32 sharded parameters under mixed precision", prec.Param, t))
	}
	if prec.Grad != moe.F32 {
		errs = append(errs, fmt.Errorf("grad_dtype = %s (--grad-dtype): %s has no field for it: gradients take the fp32 parameters' type "+
			"(training.dtype = \"bfloat16\" would make the parameters and AdamW moments %s too)", prec.Grad, t, prec.Grad))
	}
	if prec.Optimizer != moe.F32 {
		errs = append(errs, fmt.Errorf("optimizer_dtype = %s (--optimizer-dtype): %s has no field for it: AdamW's moments take the fp32 parameters' type", prec.Optimizer, t))
	}
	param, ok := torchtitanDTypes[prec.Compute]
	if !ok {
		errs = append(errs, fmt.Errorf("compute dtype = %s: %s's training.mixed_precision_param takes \"bfloat16\" or \"float32\"", prec.Compute, t))
	}
	if reduce != moe.F32 {
		errs = append(errs, fmt.Errorf("reduce_dtype = %s (--reduce-dtype): %s's training.mixed_precision_reduce takes only \"float32\"", reduce, t))
	}
	if err := errors.Join(errs...); err != nil {
		return "", "", err
	}
	return param, torchtitanDTypes[reduce], nil
}

// torchtitanPipeline returns the pipeline fields of the export for target
// as (key, value literal) pairs, and an error when the layout's split does
// not fit the model. Both pinned forms name the degree and the schedule
// alike; the micro-batches differ: v0.2.2 takes
// pipeline_parallel_microbatch_size (sequences; micro-batches = local
// batch ÷ it), main takes num_pp_microbatches (its
// num_tokens_per_microbatch_per_dp_rank then counts one pipeline
// micro-batch's tokens, configs.py TrainingConfig). The layer split is
// written only when it is not torchtitan's own (pipeline_llm: 1 stage per
// rank for single-stage schedules, 2 for multi-stage ones, split by
// generate_llm_fqn_per_model_part, whose output module is "output" at
// v0.2.2 and "lm_head" at main): as module_fqns_per_model_part, one list
// of module names per stage.
func (e *TorchtitanExport) torchtitanPipeline(target TorchtitanTarget) ([][2]string, error) {
	l := e.Point.Layout
	if l.Stages() == 1 {
		return [][2]string{{"pipeline_parallel_degree", "1"}}, nil
	}
	out := [][2]string{{"pipeline_parallel_degree", fmt.Sprint(l.PP)}, {"pipeline_parallel_schedule", fmt.Sprintf("%q", l.PPSchedule)}}
	if target == TorchtitanTOML {
		out = append(out, [2]string{"pipeline_parallel_microbatch_size", fmt.Sprint(l.PPMicrobatchSize)})
	} else {
		m, err := l.Microbatches(e.Point.LBS)
		if err != nil {
			return nil, fmt.Errorf("export: %w", err)
		}
		out = append(out, [2]string{"num_pp_microbatches", fmt.Sprint(m)})
	}
	titanV := 1
	if l.PPSchedule.MultiStage() {
		titanV = 2
	}
	split, err := l.StageSplit(e.Layers)
	if err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	if l.PPLayers == "" && l.VirtualStages() == titanV {
		return out, nil
	}
	output := "output"
	if target == TorchtitanPy {
		output = "lm_head"
	}
	var stages []string
	at := 0
	for s, n := range split {
		var names []string
		if s == 0 {
			names = append(names, `"tok_embeddings"`)
		}
		for k := at; k < at+n; k++ {
			names = append(names, fmt.Sprintf(`"layers.%d"`, k))
		}
		at += n
		if s == len(split)-1 {
			names = append(names, `"norm"`, fmt.Sprintf("%q", output))
		}
		stages = append(stages, "["+strings.Join(names, ", ")+"]")
	}
	return append(out, [2]string{"module_fqns_per_model_part", "[" + strings.Join(stages, ", ") + "]"}), nil
}

// compileComponents is torchtitan's compile.components for c.
func compileComponents(c memory.Compile) []string {
	var out []string
	if c.Model {
		out = append(out, `"model"`)
	}
	if c.Loss {
		out = append(out, `"loss"`)
	}
	return out
}

func (e *TorchtitanExport) check(target TorchtitanTarget) error {
	if e.Seq < 1 {
		return moe.FieldError{Field: "seq", Value: e.Seq, Allowed: "must be ≥ 1"}
	}
	if e.Point.LBS < 1 || e.Point.GradAccum < 1 {
		return fmt.Errorf("export: lbs = %d, grad_accum = %d: both must be ≥ 1", e.Point.LBS, e.Point.GradAccum)
	}
	if err := e.Point.Layout.Validate(); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	_, _, perr := target.CheckPrecision(e.Precision, e.ReduceDType)
	return errors.Join(TorchtitanAdmit(target, e.Point, e.Compile.Model), perr, target.CheckQuant(e.Quant),
		target.AdmitQuant(e.Quant, e.Point, e.Compile.Model))
}

// torchtitanDegrees returns torchtitan's (replicate, shard) degrees: a
// layout that shards nothing is DDP over all data-parallel ranks.
func torchtitanDegrees(l job.Layout) (rep, shard int) {
	if l.Sharding == job.ShardDDP || l.DPShard == 1 {
		return l.DP(), 1
	}
	return l.DPReplicate, l.DPShard
}

func torchtitanReshard(l job.Layout) string {
	// "default" reshards after forward when pipeline parallelism is off
	// and keeps the gathered weights when it is on (apply_fsdp:
	// reshard_after_forward = not pp_enabled); "always" and "never" say so
	// whatever the pipeline.
	switch {
	case l.ReshardAfterForward == (l.Stages() == 1):
		return "default"
	case l.ReshardAfterForward:
		return "always"
	}
	return "never"
}

func torchtitanComments(w io.Writer, lines []string) error {
	for _, s := range lines {
		for _, line := range strings.Split(s, "\n") {
			if _, err := fmt.Fprintf(w, "# %s\n", line); err != nil {
				return err
			}
		}
	}
	return nil
}

// TOML writes the TOML-era job config (sections [model], [training],
// [parallelism], [activation_checkpoint]) and returns the fields it could
// not write (a model torchtitan v0.2.2 has no flavor for).
func (e *TorchtitanExport) TOML(w io.Writer) (skipped []string, err error) {
	if err := e.check(TorchtitanTOML); err != nil {
		return nil, err
	}
	p := e.Point
	rep, shard := torchtitanDegrees(p.Layout)
	var b strings.Builder
	torchtitanComments(&b, e.Header)
	if e.Run != nil {
		fmt.Fprintf(&b, "# torchtitan %s (commit %s) job config, complete: fill each %q value, then run it.\n", TorchtitanTOMLTag, TorchtitanTOMLCommit, Placeholder+"…>")
	} else {
		fmt.Fprintf(&b, "# torchtitan %s (commit %s) job config; merge into the model's train_configs TOML.\n", TorchtitanTOMLTag, TorchtitanTOMLCommit)
	}
	e.Run.tomlJob(&b)
	conv := e.Quant.tomlConverters()
	if m, ok := torchtitanModel[e.Model]; ok {
		fmt.Fprintf(&b, "\n[model]\nname = %q\nflavor = %q\n", m.name, m.flavor)
		titanLlama4Note(&b, e.Model)
	} else {
		skipped = append(skipped, "model.name", "model.flavor")
		fmt.Fprintf(&b, "# [model] name and flavor not written: torchtitan %s has no flavor known to moescope for %q.\n", TorchtitanTOMLTag, e.Model)
		if len(conv) > 0 || e.Run != nil {
			b.WriteString("\n[model]\n")
		}
	}
	e.Run.tomlModel(&b)
	if len(conv) > 0 {
		fmt.Fprintf(&b, "converters = %s\n", quoted(conv))
	}
	fmt.Fprintf(&b, "\n[training]\nlocal_batch_size = %d\nglobal_batch_size = %d\nseq_len = %d\n", p.LBS, p.GlobalBatch(), e.Seq)
	e.Run.tomlTraining(&b)
	param, reduce, _ := TorchtitanTOML.CheckPrecision(e.Precision, e.ReduceDType) // checked above
	fmt.Fprintf(&b, "mixed_precision_param = %q\nmixed_precision_reduce = %q\n", param, reduce)
	fmt.Fprintf(&b, "\n[parallelism]\ndata_parallel_replicate_degree = %d\ndata_parallel_shard_degree = %d\n", rep, shard)
	fmt.Fprintf(&b, "fsdp_reshard_after_forward = %q\n", torchtitanReshard(p.Layout))
	pipe, err := e.torchtitanPipeline(TorchtitanTOML)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(&b, "tensor_parallel_degree = %d\n%s", p.Layout.TPDegree(), cpTOML(p.Layout))
	for _, kv := range pipe {
		fmt.Fprintf(&b, "%s = %s\n", kv[0], kv[1])
	}
	fmt.Fprintf(&b, "expert_parallel_degree = %d\n", p.Layout.EP)
	if p.Layout.TPDegree() > 1 {
		fmt.Fprintf(&b, "expert_tensor_parallel_degree = %d\nenable_async_tensor_parallel = %t\n", max(p.Layout.ETP, 1), p.Layout.AsyncTP)
	}
	if cc := compileComponents(e.Compile); len(cc) > 0 {
		fmt.Fprintf(&b, "\n[compile]\nenable = true\ncomponents = [%s]\n", strings.Join(cc, ", "))
	} else {
		b.WriteString("\n[compile]\nenable = false\n")
	}
	b.WriteString("\n[activation_checkpoint]\n")
	switch p.AC.Mode {
	case moe.ACSelective:
		b.WriteString("mode = \"selective\"\nselective_ac_option = \"op\"\n")
	case moe.ACLayer:
		fmt.Fprintf(&b, "mode = \"selective\"\nselective_ac_option = \"%d\"\n", p.AC.Every)
	default:
		fmt.Fprintf(&b, "mode = %q\n", p.AC.Mode)
	}
	if e.ForceBalance {
		b.WriteString("\n[debug]\nmoe_force_load_balance = true  # --routing balanced: round-robin experts, a debugging option\n")
	}
	e.Quant.writeTOML(&b)
	_, err = io.WriteString(w, b.String())
	return skipped, err
}

// torchtitanIdent turns s into a Python identifier of [a-z0-9_].
func torchtitanIdent(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// pyConverterLines writes the converters of q (configs, from
// pyConverters) and rebuilds the model spec with them: main applies
// converters to the model's config tree inside model_registry
// (models/<name>/__init__.py at b5bcd76c), so the spec is the registry
// function's own call (args) plus converters. A model with no registry
// function gets the list and a comment saying where it goes.
func pyConverterLines(b *strings.Builder, q TorchtitanQuant, configs []string, args string) {
	if len(configs) == 0 {
		return
	}
	fmt.Fprintf(b, "    # %s: GEMM sets %s in OCP MX FP8 (torchtitan/components/quantization/mx.py at %s); the router's gate stays bf16.\n", q.Precision, q.flag(), TorchtitanPyCommit[:7])
	b.WriteString("    converters = [\n")
	for _, c := range configs {
		fmt.Fprintf(b, "        %s,\n", c)
	}
	b.WriteString("    ]\n")
	if args == "" {
		b.WriteString("    # Pass converters to the model's model_registry when setting config.model_spec.\n")
		return
	}
	fmt.Fprintf(b, "    config.model_spec = model_registry(%s, converters=converters)\n", args)
}

// pyLossLine sets the loss the plan priced: chunks pieces of torchtitan
// main's ChunkedLossWrapper around the registry's cross-entropy, or that
// cross-entropy alone (the registry functions wrap it in 8 chunks; b5bcd76
// torchtitan/models/qwen3/config_registry.py, components/loss.py
// ChunkedLossWrapper.Config num_chunks and loss_fn). getattr keeps a loss
// the registry did not wrap.
func pyLossLine(chunks int) string {
	inner := `getattr(config.loss, "loss_fn", config.loss)`
	if chunks > 1 {
		return fmt.Sprintf("    config.loss = ChunkedLossWrapper.Config(loss_fn=%s, num_chunks=%d)\n", inner, chunks)
	}
	return "    config.loss = " + inner + "  # one piece, as priced (--loss-chunks 1)\n"
}

// Python writes a config-registry function for current torchtitan that
// starts from the model's own registry function and sets the plan's
// batch, parallelism and checkpointing; it returns the fields it could
// not write (model_spec, for a model with no registry function).
func (e *TorchtitanExport) Python(w io.Writer) (skipped []string, err error) {
	if err := errors.Join(e.check(TorchtitanPy), titanMainRefusal(e.Model)); err != nil {
		return nil, err
	}
	p := e.Point
	rep, shard := torchtitanDegrees(p.Layout)
	m := torchtitanModel[e.Model]
	name := e.Model
	if i := strings.LastIndexAny(name, `/\`); i >= 0 {
		name = name[i+1:]
	}
	name = strings.TrimSuffix(name, ".json")
	fn := fmt.Sprintf("moescope_%s_%dgpu", torchtitanIdent(name), p.Layout.GPUs)
	var b strings.Builder
	torchtitanComments(&b, e.Header)
	fmt.Fprintf(&b, "# Config-registry function for torchtitan at commit %s.\n", TorchtitanPyCommit)
	fmt.Fprintf(&b, "# Run: MODULE=<this module> CONFIG=%s ./run_train.sh on %d GPUs.\n\n", fn, p.Layout.GPUs)
	acClass, acLine := pyAC(p.AC)
	classes, converters := e.Quant.pyConverters(e.Compile.Model)
	for _, c := range classes {
		fmt.Fprintf(&b, "from torchtitan.components.quantization import %s\n", c)
	}
	if acClass != "" {
		fmt.Fprintf(&b, "from torchtitan.distributed.activation_checkpoint import %s\n", acClass)
	}
	if e.LossChunks > 1 {
		b.WriteString("from torchtitan.components.loss import ChunkedLossWrapper\n")
	}
	if m.registryFunc != "" {
		fmt.Fprintf(&b, "from %s import %s\n", m.registryModule, m.registryFunc)
		if len(converters) > 0 {
			// config_registry.py's own `from . import model_registry`.
			fmt.Fprintf(&b, "from %s import model_registry\n", strings.TrimSuffix(m.registryModule, ".config_registry"))
		}
	}
	b.WriteString("from torchtitan.trainer import Trainer\n\n\n")
	fmt.Fprintf(&b, "def %s() -> Trainer.Config:\n", fn)
	if m.registryFunc != "" {
		fmt.Fprintf(&b, "    config = %s()\n", m.registryFunc)
	} else {
		skipped = append(skipped, "model_spec")
		fmt.Fprintf(&b, "    # model_spec not written: torchtitan at this commit has no registry function known to moescope for %q; set config.model_spec.\n", e.Model)
		b.WriteString("    config = Trainer.Config()\n")
	}
	pyConverterLines(&b, e.Quant, converters, m.registryArgs)
	pipe, err := e.torchtitanPipeline(TorchtitanPy)
	if err != nil {
		return nil, err
	}
	if l := p.Layout; l.Stages() > 1 {
		fmt.Fprintf(&b, "    config.training.num_tokens_per_microbatch_per_dp_rank = %d  # pipeline micro-batch %d × seq %d\n", l.PPMicrobatchSize*e.Seq, l.PPMicrobatchSize, e.Seq)
	} else {
		fmt.Fprintf(&b, "    config.training.num_tokens_per_microbatch_per_dp_rank = %d  # lbs %d × seq %d\n", p.LBS*e.Seq, p.LBS, e.Seq)
	}
	fmt.Fprintf(&b, "    config.training.num_tokens_per_train_step = %d  # global batch %d sequences (grad_accum %d)\n", p.GlobalBatch()*e.Seq, p.GlobalBatch(), p.GradAccum)
	fmt.Fprintf(&b, "    config.training.max_context_length = %d\n", e.Seq)
	e.Run.python(&b)
	param, reduce, _ := TorchtitanPy.CheckPrecision(e.Precision, e.ReduceDType) // checked above
	fmt.Fprintf(&b, "    config.training.mixed_precision_param = %q\n", param)
	fmt.Fprintf(&b, "    config.training.mixed_precision_reduce = %q\n", reduce)
	fmt.Fprintf(&b, "    config.parallelism.data_parallel_replicate_degree = %d\n", rep)
	fmt.Fprintf(&b, "    config.parallelism.data_parallel_shard_degree = %d\n", shard)
	fmt.Fprintf(&b, "    config.parallelism.fsdp_reshard_after_forward = %q\n", torchtitanReshard(p.Layout))
	fmt.Fprintf(&b, "    config.parallelism.tensor_parallel_degree = %d\n", p.Layout.TPDegree())
	b.WriteString(cpPython(p.Layout))
	for _, kv := range pipe {
		fmt.Fprintf(&b, "    config.parallelism.%s = %s\n", kv[0], kv[1])
	}
	fmt.Fprintf(&b, "    config.parallelism.expert_parallel_degree = %d\n", p.Layout.EP)
	if cc := compileComponents(e.Compile); len(cc) > 0 {
		b.WriteString("    config.compile.enable = True\n")
		fmt.Fprintf(&b, "    config.compile.components = [%s]\n", strings.Join(cc, ", "))
		if p.Layout.AsyncTP && p.Layout.TPDegree() > 1 {
			// Main moved async TP from parallelism to the compile settings.
			b.WriteString("    config.compile.enable_async_tensor_parallel = True\n")
		}
	} else {
		b.WriteString("    config.compile.enable = False\n")
	}
	b.WriteString(acLine)
	b.WriteString(pyLossLine(e.LossChunks))
	b.WriteString(pyGraphsLine(e.CUDAGraphs))
	if e.ForceBalance {
		b.WriteString("    config.debug.moe_force_load_balance = True  # --routing balanced: round-robin experts, a debugging option\n")
	}
	b.WriteString("    return config\n")
	_, err = io.WriteString(w, b.String())
	return skipped, err
}

// pyAC returns the class main's export imports for policy ac ("" for
// none) and its activation_checkpoint line (activation_checkpoint.py at
// b5bcd76: SelectiveAC, FullAC, MemoryBudgetAC with its memory_budget).
func pyAC(ac moe.AC) (class, line string) {
	switch ac.Mode {
	case moe.ACSelective:
		class = "SelectiveAC"
	case moe.ACFull:
		class = "FullAC"
	case moe.ACMemoryBudget:
		return "MemoryBudgetAC", fmt.Sprintf("    config.activation_checkpoint = MemoryBudgetAC.Config(memory_budget=%s)\n",
			strconv.FormatFloat(ac.Budget, 'f', -1, 64))
	default:
		return "", "    config.activation_checkpoint = None\n"
	}
	return class, fmt.Sprintf("    config.activation_checkpoint = %s.Config()\n", class)
}
