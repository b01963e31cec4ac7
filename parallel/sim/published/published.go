package published

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// Run is one measured training run in the published-runs schema of
// DESIGN.md, shared by testdata/published/ and `moescope calibrate --runs`.
// Required: model, gpu, gpus, dp_shard, dp_replicate, ep, ac, lbs, seq,
// precision, tps, source (source may be waived for calibration input, see
// ReadRuns). Optional fields are pointers or zero values meaning "not
// reported". Byte counts are integers; mfu and memory_fraction fractions.
type Run struct {
	Model       string  `json:"model"` // built-in name or config.json path (relative to the file's folder)
	GPU         string  `json:"gpu"`
	GPUs        int     `json:"gpus"`
	DPShard     int     `json:"dp_shard"`
	DPReplicate int     `json:"dp_replicate"`
	EP          int     `json:"ep"`
	AC          string  `json:"ac"` // none|selective|full|layer:N|modules:M,…
	LBS         int     `json:"lbs"`
	Seq         int     `json:"seq"`
	Precision   string  `json:"precision"` // bf16, fp8, mxfp8, ...
	TPS         float64 `json:"tps"`       // tokens per second per GPU
	Source      string  `json:"source"`    // URL or repository file the numbers come from

	Cluster             string `json:"cluster,omitempty"`
	GPUsPerNode         int    `json:"gpus_per_node,omitempty"`
	TP                  int    `json:"tp,omitempty"`  // tensor-parallel degree (absent = 1)
	ETP                 int    `json:"etp,omitempty"` // expert tensor-parallel degree, 1 or tp (absent = 1)
	AsyncTP             *bool  `json:"async_tp,omitempty"`
	Sharding            string `json:"sharding,omitempty"`
	FSDPImpl            string `json:"fsdp_impl,omitempty"` // fsdp2 (absent) or megatron, job.FSDPImpl
	ReshardAfterForward *bool  `json:"reshard_after_forward,omitempty"`
	KeepGathered        *bool  `json:"keep_gathered,omitempty"`
	AllreduceLastOnly   *bool  `json:"allreduce_last_only,omitempty"`
	GradAccum           int    `json:"grad_accum,omitempty"`
	// Pipeline options (DESIGN's schema; absent = no pipeline parallelism,
	// or torchtitan's defaults under pp > 1, job.Layout.Resolve).
	PP                int             `json:"pp,omitempty"`
	PPSchedule        string          `json:"pp_schedule,omitempty"`
	PPMicrobatchSize  int             `json:"pp_microbatch_size,omitempty"`
	PPVirtualStages   int             `json:"pp_virtual_stages,omitempty"`
	PPLayers          job.StageLayers `json:"pp_layers,omitempty"`
	Compile           *bool           `json:"compile,omitempty"`
	Framework         string          `json:"framework,omitempty"`
	FrameworkVersion  string          `json:"framework_version,omitempty"`
	MemoryFraction    *float64        `json:"memory_fraction,omitempty"`
	PeakReservedBytes *int64          `json:"peak_reserved_bytes,omitempty"`
	MFU               *float64        `json:"mfu,omitempty"`
	// RunID names the run in the shared validation table of published runs
	// (published_runs.csv: R170, ...) when it was copied from there; ""
	// otherwise. No two published runs share one (CheckDuplicates).
	RunID string `json:"run_id,omitempty"`
	// PeakAllocatedBytes is a measured peak of allocated bytes
	// (torch.cuda.max_memory_allocated), for a source that prints that
	// rather than the peak reserved (an addition to DESIGN's schema:
	// peak_reserved_bytes and memory_fraction always mean reserved memory).
	PeakAllocatedBytes *int64 `json:"peak_allocated_bytes,omitempty"`
	// Optimizer is the AdamW implementation, fused or foreach (an addition
	// to DESIGN's schema; "" = fused, torchtitan's default since 2025).
	Optimizer string `json:"optimizer,omitempty"`
	// TorchVersion is the PyTorch release the run used, MAJOR.MINOR (an
	// addition to DESIGN's schema; absent = 2.9 or later). It decides the
	// kernels of eager mode (before 2.9 RMSNorm is a composite of fp32
	// kernels).
	TorchVersion string `json:"torch_version,omitempty"`
	// FusedElementwise says the run's framework runs each elementwise op
	// as one fused kernel of its own (TransformerEngine and Megatron-Core
	// fusions of RMSNorm, RoPE, SwiGLU and cross-entropy) where eager
	// PyTorch would run several (an addition to DESIGN's schema; absent =
	// false).
	FusedElementwise bool `json:"fused_elementwise,omitempty"`
	// PowerLimited says the source ran its GPUs below their default power
	// limit without stating the limit (an addition to DESIGN's schema;
	// absent = false). The time model prices a device at its default
	// limit, so such a run's step time cannot be predicted and
	// InputForRun refuses it; its memory does not depend on the clock.
	PowerLimited bool `json:"power_limited,omitempty"`
	// Dispatcher is how the run's framework moves expert-parallel tokens:
	// absent or all_to_all (torchtitan's), deepep or hybridep (DeepEP's
	// kernels: one row per token and destination rank; an addition to
	// DESIGN's schema).
	Dispatcher string `json:"dispatcher,omitempty"`
	// ExpertGEMM is the kernel of the routed experts' matmuls: absent or
	// grouped_mm (torch._grouped_mm, torchtitan's), cublas
	// (TransformerEngine's GroupedLinear, one cuBLAS GEMM per expert; an
	// addition to DESIGN's schema).
	ExpertGEMM string `json:"expert_gemm,omitempty"`
	// LossChunks is the number of chunks of a chunked cross-entropy (an
	// addition to DESIGN's schema; 0 = unchunked).
	LossChunks int `json:"loss_chunks,omitempty"`
	// AttentionKernel is the SDPA backend the run's software chose, cudnn
	// or flash2 (an addition to DESIGN's schema; "" = cudnn, torchtitan's
	// choice since it sets the SDPA priority).
	AttentionKernel string `json:"attention_kernel,omitempty"`
	// ExpandableSegments is the run's PYTORCH_ALLOC_CONF
	// expandable_segments setting (DESIGN's schema; absent = on, as
	// torchtitan's run_train.sh sets it).
	ExpandableSegments *bool `json:"expandable_segments,omitempty"`
	// CompileComponents is torchtitan's compile.components when the run
	// compiled only some parts ("model", "loss"; an addition to DESIGN's
	// schema: absent = both when compile is on). torchtitan before
	// bbb1b616e (2025-04-02) never compiled the loss.
	CompileComponents []string `json:"compile_components,omitempty"`
	// ParamDType, GradDType and OptimizerDType are storage types when the
	// run's framework does not keep torchtitan's fp32 parameters,
	// gradients and AdamW moments (an addition to DESIGN's schema: f32 or
	// bf16; absent = f32).
	ParamDType     string `json:"param_dtype,omitempty"`
	GradDType      string `json:"grad_dtype,omitempty"`
	OptimizerDType string `json:"optimizer_dtype,omitempty"`
	// ReduceDType is FSDP2's MixedPrecisionPolicy.reduce_dtype when it
	// differs from grad_dtype (an addition to DESIGN's schema: f32 or bf16;
	// absent = grad_dtype).
	ReduceDType string `json:"reduce_dtype,omitempty"`
	// GradSyncLastOnly says the run skipped every gradient reduction
	// before the last accumulation micro-step (FSDP2's
	// set_requires_gradient_sync(False)); an FSDP option beside
	// allreduce_last_only, absent = false.
	GradSyncLastOnly *bool `json:"grad_sync_last_only,omitempty"`
	// LossDType is the type the eager cross-entropy computes in (an
	// addition to DESIGN's schema: absent = f32, torchtitan's
	// pred.float(); bf16 for a loss on the bf16 logits).
	LossDType string `json:"loss_dtype,omitempty"`
	// Unmodelled names a difference of the run's framework that changes
	// its memory or time and that moescope does not model (an addition to
	// DESIGN's schema; "" = none known). Tables mark such rows and keep
	// them in their medians and worst cases.
	Unmodelled string `json:"unmodelled,omitempty"`
	// MTP says whether the run trained the model's multi-token-prediction
	// modules (num_nextn_predict_layers; DESIGN's schema). Memory and step
	// time do not model them yet, so true is refused (Validate); absent or
	// false = trained without them.
	MTP *bool `json:"mtp,omitempty"`
	// Notes say what the numbers are and any deviation from the schema's
	// assumptions (an addition to DESIGN's schema; free text).
	Notes string `json:"notes,omitempty"`

	// File is the file the run was read from (not serialized).
	File string `json:"-"`
}

// Compiled reports whether the run used torch.compile. A run that does not
// say is taken as compiled, DESIGN's default (--compile) and what
// torchtitan's performance configurations set.
func (r Run) Compiled() bool { return r.Compile == nil || *r.Compile }

// Recipe is what the run executes with (job.Recipe, resolved): every field
// the run states, torchtitan's default (job.DefaultRecipe) for each it
// leaves out, compiled unless it says otherwise (Compiled). Its precision
// is the schema's own free text until a predicting caller checks it
// (Spec); the recipe keeps the default.
func (r Run) Recipe() (job.Recipe, error) {
	rec := job.DefaultRecipe()
	rec.Compile = r.Compiled()
	for _, c := range r.CompileComponents {
		rec.CompileComponents = append(rec.CompileComponents, job.Component(c))
	}
	if r.ExpandableSegments != nil {
		rec.ExpandableSegments = *r.ExpandableSegments
	}
	rec.LossChunks, rec.FusedElementwise = r.LossChunks, r.FusedElementwise
	for _, f := range []struct {
		v   string
		dst *moe.DType
	}{{r.ParamDType, &rec.ParamDType}, {r.GradDType, &rec.GradDType}, {r.OptimizerDType, &rec.OptimizerDType},
		{r.ReduceDType, &rec.ReduceDType}, {r.LossDType, &rec.LossDType}} {
		if f.v != "" {
			*f.dst = moe.DType(f.v)
		}
	}
	setEnum(&rec.Optimizer, r.Optimizer)
	setEnum(&rec.Attention, r.AttentionKernel)
	setEnum(&rec.Dispatcher, r.Dispatcher)
	setEnum(&rec.ExpertGEMM, r.ExpertGEMM)
	tv, err := job.ParseTorchVersion("torch_version", r.TorchVersion)
	if err != nil {
		return rec, err
	}
	rec.Torch = tv
	return rec, rec.Resolve()
}

// setEnum sets *dst to a stated value (absent: the default stays).
func setEnum[T ~string](dst *T, v string) {
	if v != "" {
		*dst = T(v)
	}
}

// Spec is the run's description for model cfg: its layout, batch,
// checkpointing and recipe, with its precision checked as priced.
func (r Run) Spec(cfg *moe.Config) (job.Spec, error) {
	l, err := r.Layout()
	if err != nil {
		return job.Spec{}, err
	}
	ac, err := moe.ParseAC(r.AC)
	if err != nil {
		return job.Spec{}, err
	}
	rec, err := r.Recipe()
	if err != nil {
		return job.Spec{}, err
	}
	rec.Precision = job.Precision(r.Precision)
	if err := rec.Precision.Check("precision"); err != nil {
		return job.Spec{}, err
	}
	s := job.Spec{Model: cfg, Layout: l, Batch: job.Batch{LBS: r.LBS, Seq: r.Seq, GradAccum: max(1, r.GradAccum)}, AC: ac, Recipe: rec}
	return s, s.Validate()
}

// Layout returns the run's layout, resolved and validated.
func (r Run) Layout() (job.Layout, error) {
	l := job.Layout{GPUs: r.GPUs, DPShard: r.DPShard, DPReplicate: r.DPReplicate, EP: r.EP, TP: r.TP, ETP: r.ETP,
		Sharding: job.Sharding(r.Sharding), FSDPImpl: job.FSDPImpl(r.FSDPImpl), ReshardAfterForward: true, GPUsPerNode: r.GPUsPerNode,
		PP: r.PP, PPSchedule: job.PPSchedule(r.PPSchedule), PPMicrobatchSize: r.PPMicrobatchSize,
		PPVirtualStages: r.PPVirtualStages, PPLayers: r.PPLayers}
	// torchtitan's default reshards after forward except under PP
	// (apply_fsdp: reshard_after_forward = not pp_enabled).
	l.ReshardAfterForward = r.PP <= 1
	if r.AsyncTP != nil {
		l.AsyncTP = *r.AsyncTP
	}
	if r.ReshardAfterForward != nil {
		l.ReshardAfterForward = *r.ReshardAfterForward
	}
	if r.KeepGathered != nil {
		l.KeepGathered = *r.KeepGathered
	}
	if r.AllreduceLastOnly != nil {
		l.AllreduceLastOnly = *r.AllreduceLastOnly
	}
	if r.GradSyncLastOnly != nil {
		l.GradSyncLastOnly = *r.GradSyncLastOnly
	}
	return l, l.Resolve()
}

// MeasuredReserved returns the run's measured peak reserved bytes, if any:
// peak_reserved_bytes, else memory_fraction × dev's capacity.
func (r Run) MeasuredReserved(dev hw.Device) (float64, bool) {
	if r.PeakReservedBytes != nil {
		return float64(*r.PeakReservedBytes), true
	}
	if r.MemoryFraction != nil {
		return *r.MemoryFraction * float64(dev.MemoryBytes), true
	}
	return 0, false
}

// Validate checks the run's fields (not the model name, which needs hf.Load).
func (r Run) Validate(requireSource bool) error {
	var errs []error
	bad := func(field string, v any, allowed string) {
		errs = append(errs, moe.FieldError{Field: field, Value: v, Allowed: allowed})
	}
	if r.Model == "" {
		bad("model", r.Model, "required: a built-in model name or a config.json path")
	}
	if r.GPU == "" {
		bad("gpu", r.GPU, "required: a device name")
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"gpus", r.GPUs}, {"dp_shard", r.DPShard}, {"dp_replicate", r.DPReplicate}, {"ep", r.EP}, {"lbs", r.LBS}, {"seq", r.Seq}} {
		if f.v < 1 {
			bad(f.name, f.v, "required, ≥ 1")
		}
	}
	if _, err := moe.ParseAC(r.AC); err != nil {
		errs = append(errs, err)
	}
	if r.Precision == "" {
		bad("precision", r.Precision, "required: bf16, fp8, mxfp8, ...")
	}
	if !(r.TPS > 0) {
		bad("tps", r.TPS, "required, > 0 tokens per second per GPU")
	}
	if requireSource && r.Source == "" {
		bad("source", r.Source, "required: the URL or file the numbers come from")
	}
	if r.GradAccum < 0 {
		bad("grad_accum", r.GradAccum, "must be ≥ 1 (0 = 1)")
	}
	if r.PeakReservedBytes != nil && *r.PeakReservedBytes < 1 {
		bad("peak_reserved_bytes", *r.PeakReservedBytes, "must be ≥ 1")
	}
	if r.PeakAllocatedBytes != nil && *r.PeakAllocatedBytes < 1 {
		bad("peak_allocated_bytes", *r.PeakAllocatedBytes, "must be ≥ 1")
	}
	if r.MemoryFraction != nil && !(*r.MemoryFraction > 0) {
		bad("memory_fraction", *r.MemoryFraction, "must be > 0")
	}
	if r.MFU != nil && !(*r.MFU > 0 && *r.MFU <= 1) {
		bad("mfu", *r.MFU, "must be a fraction in (0, 1]")
	}
	if r.MTP != nil && *r.MTP {
		bad("mtp", true, "false or absent: the MTP modules' memory and time are not modelled yet (moescope flops --mtp counts their FLOPs)")
	}
	if len(errs) == 0 {
		if _, err := r.Layout(); err != nil {
			errs = append(errs, err)
		}
		if _, err := r.Recipe(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// maxRunsBytes bounds what ReadRuns reads: a table of measured runs is a
// few KiB per run; a device or pipe (/dev/zero) must not be read forever.
const maxRunsBytes = 16 << 20

// ReadRuns decodes a JSON array of runs, rejecting unknown fields, and
// validates each (source required when requireSource). name labels errors.
// At most 16 MiB are read.
func ReadRuns(rd io.Reader, name string, requireSource bool) ([]Run, error) {
	data, err := io.ReadAll(io.LimitReader(rd, maxRunsBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(data) > maxRunsBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes: not a runs file", name, maxRunsBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var runs []Run
	if err := dec.Decode(&runs); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: data after the JSON array", name)
	}
	var errs []error
	for i := range runs {
		runs[i].File = name
		if err := runs[i].Validate(requireSource); err != nil {
			errs = append(errs, fmt.Errorf("%s: run %d: %w", name, i, err))
		}
	}
	return runs, errors.Join(errs...)
}

// Load reads every *.json file directly in dir (sorted by name)
// as an array of runs with sources. A model given as a relative path is
// made relative to dir.
func Load(dir string) ([]Run, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	var all []Run
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		runs, err := ReadRuns(f, p, true)
		f.Close()
		if err != nil {
			return nil, err
		}
		for i := range runs {
			if strings.ContainsAny(runs[i].Model, `/\`) && !filepath.IsAbs(runs[i].Model) {
				runs[i].Model = filepath.Join(dir, runs[i].Model)
			}
		}
		all = append(all, runs...)
	}
	if err := CheckDuplicates(all); err != nil {
		return nil, err
	}
	return all, nil
}

// CheckDuplicates reports every run recorded twice: two runs with the same
// run_id, or with the same configuration (every field but the measured
// numbers — tps, mfu, memory_fraction, the peaks — the notes and the
// run_id) from the same source. Sources are compared without their
// parenthesised remark and with any commit in a /blob/<commit>/ URL
// dropped, so that one document cited at two commits is one source.
func CheckDuplicates(runs []Run) error {
	var errs []error
	byID := map[string]Run{}
	byConfig := map[string]Run{}
	for _, r := range runs {
		if r.RunID != "" {
			if p, ok := byID[r.RunID]; ok {
				errs = append(errs, fmt.Errorf("run_id %s: in %s and in %s", r.RunID, p.File, r.File))
			}
			byID[r.RunID] = r
		}
		k, err := configKey(r)
		if err != nil {
			return err
		}
		if p, ok := byConfig[k]; ok {
			errs = append(errs, fmt.Errorf("%s (%s) and %s (%s): the same configuration from the same source %s",
				p.File, p.Label(), r.File, r.Label(), sourceKey(r.Source)))
		}
		byConfig[k] = r
	}
	return errors.Join(errs...)
}

// Label names a run in messages: its run_id, else its model and scale.
func (r Run) Label() string {
	if r.RunID != "" {
		return r.RunID
	}
	return fmt.Sprintf("%s on %d %s", r.Model, r.GPUs, r.GPU)
}

// configKey is the run's configuration and source, measured numbers and
// annotations left out.
func configKey(r Run) (string, error) {
	c := r
	c.TPS, c.MFU, c.MemoryFraction, c.PeakReservedBytes, c.PeakAllocatedBytes = 0, nil, nil, nil, nil
	c.Notes, c.RunID, c.File = "", "", ""
	c.Source = sourceKey(r.Source)
	b, err := json.Marshal(c)
	return string(b), err
}

// sourceKey is a source without its parenthesised remark and without the
// commit of a GitHub /blob/<commit>/ URL.
func sourceKey(s string) string {
	if i := strings.Index(s, " ("); i >= 0 {
		s = s[:i]
	}
	s = strings.TrimSpace(s)
	if i := strings.Index(s, "/blob/"); i >= 0 {
		rest := s[i+len("/blob/"):]
		if j := strings.IndexByte(rest, '/'); j > 0 {
			s = s[:i] + "/blob/-/" + rest[j+1:]
		}
	}
	return s
}
