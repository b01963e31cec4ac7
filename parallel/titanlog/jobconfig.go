package titanlog

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/plan"
)

// Form is the schema a job config follows.
type Form string

// The schemas read.
const (
	// FormTOML: a TOML job config of torchtitan v0.2.2
	// (torchtitan/config/job_config.py at plan.TorchtitanTOMLCommit), or
	// the same sections as JSON (what v0.2.2 prints under
	// `Running with configs:` and writes with job.save_config_file).
	FormTOML Form = "torchtitan " + plan.TorchtitanTOMLTag + " job config"
	// FormRegistry: a config-registry function of current torchtitan, in
	// the form moescope plan --torchtitan-py writes (plan.TorchtitanPyCommit).
	FormRegistry Form = "torchtitan main config registry"
	// FormPrintedMain: the JSON current torchtitan prints at start-up
	// (Trainer.Config.to_dict in torchtitan/trainer.py at b5bcd76).
	FormPrintedMain Form = "torchtitan main printed config"
)

// Job is what a job config fixes about a run, in moescope's terms: batch
// fields count sequences whatever the schema counts.
type Job struct {
	Where                     string // the file, or the log line, for messages
	Form                      Form
	Model                     string // moescope built-in name
	LBS, GlobalBatch, Seq     int    // GlobalBatch 0: lbs × data-parallel degree
	DPReplicate, DPShard, EP  int    // DPShard -1: the rest of the world
	TP, CP, PP                int
	ETP                       int  // v0.2.2's expert_tensor_parallel_degree; 1 under main (EP borrows the tp ranks)
	AsyncTP                   bool // v0.2.2 parallelism.enable_async_tensor_parallel, main compile.enable_async_tensor_parallel
	ReshardAfterForward       bool
	AC                        string // moescope's names: none|selective|full|layer:N
	Compile                   bool
	CompileModel, CompileLoss bool
	// Precision is the training recipe (job.Precision's names), Quantize
	// the GEMM sets it converts (empty: the recipe's default) and
	// FP8AllGather torchao's float8 all-gather and FP8RowwiseGWHP its
	// rowwise_with_gw_hp recipe, read from the converters (quant.go).
	Precision      string
	Quantize       job.Quantize
	FP8AllGather   bool
	FP8RowwiseGWHP bool
	// LossChunks is the chunked loss's chunk count a registry function
	// sets (plan.TorchtitanExport's loss line); 0: one piece.
	LossChunks int
}

// maxConfigBytes bounds a job-config file: torchtitan's are a few KiB.
const maxConfigBytes = 4 << 20

// ReadJobConfig reads a job config, its schema chosen by extension: .toml
// (v0.2.2), .json (v0.2.2's sections as JSON, or main's printed form), .py
// (a registry function as moescope exports it).
func ReadJobConfig(path string) (*Job, error) {
	data, err := fileio.ReadBounded(path, maxConfigBytes)
	if err != nil {
		return nil, err
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".toml":
		return ParseTOML(path, data)
	case ".json":
		return parseJSONConfig(path, data)
	case ".py":
		return ParseRegistry(path, data)
	}
	return nil, fmt.Errorf("--job-config %s: extension %q: must be .toml (torchtitan %s), .json (a printed or saved config) or .py (a config-registry function)",
		path, filepath.Ext(path), plan.TorchtitanTOMLTag)
}

// ParseTOML reads a v0.2.2 TOML job config.
func ParseTOML(where string, data []byte) (*Job, error) {
	var doc map[string]any
	if _, err := toml.Decode(string(data), &doc); err != nil {
		return nil, fmt.Errorf("%s: not TOML: %w", where, err)
	}
	return fromSections(where, doc)
}

// FromPrinted reads the config a log printed at start-up (Log.Config).
func FromPrinted(where string, cfg map[string]any) (*Job, error) {
	return fromSections(where, cfg)
}

// fromSections dispatches a decoded config on its shape: main's to_dict
// has model_spec where v0.2.2 has model.
func fromSections(where string, doc map[string]any) (*Job, error) {
	v := &values{where: where, m: map[string]any{}}
	for sec, body := range doc {
		if m, ok := body.(map[string]any); ok {
			v.flatten(sec, m)
		}
	}
	if _, ok := doc["model_spec"]; ok {
		return v.printedMain()
	}
	return v.v022()
}

// flatten files a section's keys under "section.key", and the keys of its
// tables ([quantize.linear.float8]) under their dotted names.
func (v *values) flatten(prefix string, m map[string]any) {
	for k, x := range m {
		if sub, ok := x.(map[string]any); ok {
			v.flatten(prefix+"."+k, sub)
			continue
		}
		v.m[prefix+"."+k] = x
	}
}

// v022 interprets v0.2.2's sections; absent keys take job_config.py's
// defaults at 73a0e69 (Training, Parallelism, ActivationCheckpoint,
// Compile, Model).
func (v *values) v022() (*Job, error) {
	j := &Job{Where: v.where, Form: FormTOML, Precision: "bf16"}
	name, flavor := v.str("model.name", ""), v.str("model.flavor", "")
	if name == "" || flavor == "" {
		v.fail("model.name and model.flavor", fmt.Sprintf("%q, %q", name, flavor), "required: the torchtitan model and flavor (v0.2.2's defaults, llama3 debugmodel, are no moescope model)")
	} else if m, err := plan.TorchtitanModelFor(name, flavor); err != nil {
		v.errs = append(v.errs, err)
	} else {
		j.Model = m
	}
	j.LBS, j.GlobalBatch, j.Seq = v.int("training.local_batch_size", 8), v.int("training.global_batch_size", -1), v.int("training.seq_len", 2048)
	if j.GlobalBatch == -1 {
		j.GlobalBatch = 0
	}
	if p := v.str("training.mixed_precision_param", "bfloat16"); p != "bfloat16" {
		v.fail("training.mixed_precision_param", p, "moescope models bfloat16 compute weights only")
	}
	v.quantV022(j)
	v.parallelism(j)
	switch mode := v.str("activation_checkpoint.mode", "selective"); mode {
	case "none", "full":
		j.AC = mode
	case "selective":
		switch opt := v.str("activation_checkpoint.selective_ac_option", "2"); {
		case opt == "op":
			j.AC = "selective"
		case isPositiveInt(opt):
			j.AC = "layer:" + opt
		default:
			v.fail("activation_checkpoint.selective_ac_option", opt, `"op" or a positive block interval`)
		}
	default:
		v.fail("activation_checkpoint.mode", mode, "none, selective or full (memory_budget: v0.2.2 compiles MoE blocks by submodule with eager routed experts, which moescope's memory budget, after main's whole-block compile, does not model)")
	}
	v.compile(j, []string{"model", "loss"})
	return j, v.err()
}

// parallelism reads the degrees and the reshard policy (the same keys in
// both schemas).
func (v *values) parallelism(j *Job) {
	j.DPReplicate, j.DPShard = v.int("parallelism.data_parallel_replicate_degree", 1), v.int("parallelism.data_parallel_shard_degree", -1)
	j.TP, j.CP, j.PP = v.int("parallelism.tensor_parallel_degree", 1), v.int("parallelism.context_parallel_degree", 1), v.int("parallelism.pipeline_parallel_degree", 1)
	j.EP = v.int("parallelism.expert_parallel_degree", 1)
	j.ETP = 1
	if j.Form == FormTOML {
		// v0.2.2 job_config.py Parallelism: expert_tensor_parallel_degree
		// (default 1) and enable_async_tensor_parallel; main has no etp and
		// moved async TP to CompileConfig.
		j.ETP = v.int("parallelism.expert_tensor_parallel_degree", 1)
		j.AsyncTP = v.bool("parallelism.enable_async_tensor_parallel", false)
	} else {
		j.AsyncTP = v.bool("compile.enable_async_tensor_parallel", false)
	}
	for _, d := range []struct {
		key string
		v   int
	}{{"context_parallel_degree", j.CP}, {"pipeline_parallel_degree", j.PP}} {
		if d.v != 1 {
			v.fail("parallelism."+d.key, d.v, "must be 1: moescope's runs schema reads data, tensor and expert parallelism only")
		}
	}
	if j.TP < 1 {
		v.fail("parallelism.tensor_parallel_degree", j.TP, "must be ≥ 1")
	}
	// "default" reshards after forward unless pipeline parallelism is on
	// (job_config.py Parallelism.fsdp_reshard_after_forward), and it is off.
	switch r := v.str("parallelism.fsdp_reshard_after_forward", "default"); r {
	case "default", "always":
		j.ReshardAfterForward = true
	case "never":
	default:
		v.fail("parallelism.fsdp_reshard_after_forward", r, "default, always or never")
	}
}

// compile reads compile.enable and compile.components.
func (v *values) compile(j *Job, def []string) {
	j.Compile = v.bool("compile.enable", false)
	comps := def
	if _, ok := v.m["compile.components"]; ok {
		comps = v.list("compile.components")
	}
	for _, c := range comps {
		switch c {
		case "model":
			j.CompileModel = true
		case "loss":
			j.CompileLoss = true
		default:
			v.fail("compile.components", c, `"model" or "loss"`)
		}
	}
}

func isPositiveInt(s string) bool {
	if s == "" || s[0] == '0' {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return len(s) < 7
}
