package published

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// Run is one measured training run in the published-runs schema of
// DESIGN.md, shared by parallel/sim/validate/testdata/published/ and `moescope calibrate --runs`:
// the run's description (job.Spec's JSON: the layout's, the batch's and the
// recipe's keys side by side with "ac") plus the model's name, the hardware
// and the measured fields. Required: model, gpu, gpus, dp_shard,
// dp_replicate, ep, ac, lbs, seq, precision, tps, source (source may be
// waived for calibration input, see ReadRuns). ReadRuns decodes each run
// over the schema's defaults (Defaults) and resolves it (Resolve), so a
// key left out keeps its default. Optional measured fields are pointers or
// zero values meaning "not reported". Byte counts are integers; mfu and
// memory_fraction fractions.
type Run struct {
	Model string `json:"model"` // built-in name or config.json path (relative to the file's folder)
	GPU   string `json:"gpu"`
	// Spec is the run's layout, batch, checkpointing and recipe (its Model
	// is not serialized; Run.Model names it). Its recipe's precision keeps
	// the default until a predicting caller checks Precision (SpecFor).
	job.Spec
	// Precision is the schema's precision, a recipe name or a published
	// table's spelling of one ("FP8-CS", "MXFP8 (params)"; PrecisionRecipe reads
	// both): it shadows the recipe's, and SpecFor refuses what is not a
	// priced recipe.
	Precision string  `json:"precision"`
	TPS       float64 `json:"tps"`    // tokens per second per GPU
	Source    string  `json:"source"` // URL or repository file the numbers come from

	Cluster           string   `json:"cluster,omitempty"`
	Framework         string   `json:"framework,omitempty"`
	FrameworkVersion  string   `json:"framework_version,omitempty"`
	MemoryFraction    *float64 `json:"memory_fraction,omitempty"`
	PeakReservedBytes *int64   `json:"peak_reserved_bytes,omitempty"`
	MFU               *float64 `json:"mfu,omitempty"`
	// RunID names the run in the shared validation table of published runs
	// (published_runs.csv: R170, ...) when it was copied from there; ""
	// otherwise. No two published runs share one (CheckDuplicates).
	RunID string `json:"run_id,omitempty"`
	// PeakAllocatedBytes is a measured peak of allocated bytes
	// (torch.cuda.max_memory_allocated), for a source that prints that
	// rather than the peak reserved (an addition to DESIGN's schema:
	// peak_reserved_bytes and memory_fraction always mean reserved memory).
	PeakAllocatedBytes *int64 `json:"peak_allocated_bytes,omitempty"`
	// PowerLimited says the source ran its GPUs below their default power
	// limit without stating the limit (an addition to DESIGN's schema;
	// absent = false). The time model prices a device at its default
	// limit, so such a run's step time cannot be predicted and
	// InputForRun refuses it; its memory does not depend on the clock.
	PowerLimited bool `json:"power_limited,omitempty"`
	// Unmodelled names a difference of the run's framework that changes
	// its memory or time and that moescope does not model (an addition to
	// DESIGN's schema; "" = none known). Tables mark such rows and keep
	// them in their medians and worst cases.
	Unmodelled string `json:"unmodelled,omitempty"`
	// Inconsistent says, with a worked reason, why the settings the source
	// states cannot be the ones its run used (an addition to DESIGN's
	// schema; "" = none found): a validation prints such a run's memory
	// verdict, marked, without judging it; its TPS is compared as stated.
	Inconsistent string `json:"inconsistent,omitempty"`
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
	// models is the file system a relative model path is read from
	// (LoadFS); nil: the disk.
	models fs.FS
}

// Defaults is what a run's description holds before its keys are read:
// torchtitan's recipe (job.DefaultRecipe: compiled, expandable segments,
// fused AdamW, cuDNN attention, fp32 state, reduce_dtype = grad_dtype),
// one micro-step, fsdp sharding that reshards after forward (ReadRuns
// turns the reshard off under pp > 1 when the key is absent, torchtitan's
// not pp_enabled); tp and etp 0 read as 1. The required degrees, batch and
// checkpointing are left zero so that a run must state them. A Run built
// in code starts from these.
func Defaults() job.Spec {
	return job.Spec{Layout: job.Layout{Sharding: job.ShardFSDP, ReshardAfterForward: true},
		Batch: job.Batch{GradAccum: 1}, Recipe: job.DefaultRecipe()}
}

// Resolve fills the defaults that depend on other fields (the layout's
// derived degrees, tp and etp 1, grad_accum 0 = 1, reduce_dtype =
// grad_dtype: job.Spec's resolution without the model) and validates the
// description, each rule its part's own.
func (r *Run) Resolve() error {
	if r.GradAccum == 0 {
		r.GradAccum = 1
	}
	// The recipe's own rules (quantize, fp8_all_gather) depend on its
	// precision, which the run's precision text names.
	if p, err := r.PrecisionRecipe(); err == nil {
		r.Recipe.Precision = p
	}
	var errs []error
	for _, err := range []error{r.Layout.Resolve(), r.Batch.Validate(), r.AC.Validate(), r.Recipe.Resolve()} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// SpecFor is the run's description for model cfg, resolved and validated
// against the model, with the run's precision checked as priced.
func (r Run) SpecFor(cfg *moe.Config) (job.Spec, error) {
	s := r.Spec
	s.Model = cfg
	p, err := r.PrecisionRecipe()
	if err != nil {
		return job.Spec{}, err
	}
	s.Precision = p
	if err := s.Precision.Check("precision"); err != nil {
		return job.Spec{}, err
	}
	return s, s.Resolve()
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

// Validate checks the run's fields (not the model name, which needs
// hf.Load): the required and measured ones here, the description by its
// parts' own rules (Resolve, on a copy).
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
	if r.AC.Mode == "" {
		bad("ac", "", "required: none, selective, full, layer:N or modules:M,…")
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
		c := r
		if err := c.Resolve(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// maxRunsBytes bounds what ReadRuns reads: a table of measured runs is a
// few KiB per run; a device or pipe (/dev/zero) must not be read forever.
const maxRunsBytes = 16 << 20

// ReadRuns decodes a JSON array of runs, rejecting unknown fields: each
// run over Defaults (a key left out keeps its default; reshard_after_forward
// left out is false under pp > 1), validated (source required when
// requireSource) and resolved. name labels errors. At most 16 MiB are
// read.
func ReadRuns(rd io.Reader, name string, requireSource bool) ([]Run, error) {
	data, err := io.ReadAll(io.LimitReader(rd, maxRunsBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(data) > maxRunsBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes: not a runs file", name, maxRunsBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var raws []json.RawMessage
	if err := dec.Decode(&raws); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: data after the JSON array", name)
	}
	runs := make([]Run, len(raws))
	var errs []error
	for i, raw := range raws {
		r, err := decodeRun(raw)
		if err == nil {
			r.File = name
			if err = r.Validate(requireSource); err == nil {
				err = r.Resolve()
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: run %d: %w", name, i, err))
		}
		runs[i] = r
	}
	return runs, errors.Join(errs...)
}

// decodeRun reads one run over Defaults, unknown keys refused.
func decodeRun(raw json.RawMessage) (Run, error) {
	r := Run{Spec: Defaults()}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, err
	}
	// torchtitan reshards after forward except under PP (apply_fsdp:
	// reshard_after_forward = not pp_enabled): the default needs to know
	// whether the key was given.
	var stated struct {
		ReshardAfterForward *bool `json:"reshard_after_forward"`
	}
	if err := json.Unmarshal(raw, &stated); err != nil {
		return r, err
	}
	if stated.ReshardAfterForward == nil {
		r.ReshardAfterForward = r.PP <= 1
	}
	return r, nil
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
