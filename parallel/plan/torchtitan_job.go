package plan

import (
	"fmt"
	"strings"
)

// Placeholder opens every value an export leaves for the user to fill:
// the paths and names only the user knows (the model's tokenizer files, the
// dataset). torchtitan would fail on them at start-up, and calibrate refuses
// a log whose printed config still holds one.
const Placeholder = "<FILL: "

// placeholder is the value Placeholder + what + ">".
func placeholder(what string) string { return Placeholder + what + ">" }

// TorchtitanRun makes an export a complete job config that torchtitan runs
// as written (once its placeholders are filled) rather than a fragment to
// merge into a model's train config: the sweep's jobs carry one, plan's
// exports none.
//
// For the v0.2.2 TOML it writes what the file would otherwise take from
// v0.2.2's defaults (torchtitan/config/job_config.py at 73a0e6979dd1: Job,
// Metrics, Model, LRScheduler, Training): the job's description and
// output folder, print_config on (so the log states the config it ran),
// the tokenizer's folder (model.hf_assets_path, default a test tokenizer)
// and the dataset (training.dataset, default "c4_test") as placeholders,
// the steps, metrics every step, and a warm-up of a fifth of the steps
// (its default, 200, would outlast the run). The registry form starts from
// the model's own registry function, which names its own assets and
// dataset at main (qwen3_30b_a3b: ./assets/hf/Qwen3-30B-A3B, c4); it gets
// the tokenizer folder as a placeholder and the steps.
type TorchtitanRun struct {
	Name  string // job.description and the folder under ./outputs (job.dump_folder)
	Steps int    // training.steps, ≥ 1
}

// tomlJob writes the [job] and [metrics] sections and the [lr_scheduler]
// warm-up.
func (r *TorchtitanRun) tomlJob(b *strings.Builder) {
	if r == nil {
		return
	}
	fmt.Fprintf(b, "\n[job]\ndescription = %q\ndump_folder = %q\nprint_config = true\n", r.Name, "./outputs/"+r.Name)
	b.WriteString("\n[metrics]\nlog_freq = 1\n")
	fmt.Fprintf(b, "\n[lr_scheduler]\nwarmup_steps = %d\n", max(1, r.Steps/5))
}

// tomlModel writes the [model] keys of a complete job (after name and
// flavor).
func (r *TorchtitanRun) tomlModel(b *strings.Builder) {
	if r != nil {
		fmt.Fprintf(b, "hf_assets_path = %q\n", placeholder("folder of the model's Hugging Face tokenizer files"))
	}
}

// tomlTraining writes the [training] keys of a complete job.
func (r *TorchtitanRun) tomlTraining(b *strings.Builder) {
	if r != nil {
		fmt.Fprintf(b, "steps = %d\ndataset = %q\n", r.Steps, placeholder("a dataset name of DATASETS in torchtitan/hf_datasets/text_datasets.py, e.g. c4"))
	}
}

// python writes the registry function's lines of a complete job.
func (r *TorchtitanRun) python(b *strings.Builder) {
	if r == nil {
		return
	}
	fmt.Fprintf(b, "    config.hf_assets_path = %q\n", placeholder("folder of the model's Hugging Face tokenizer files"))
	fmt.Fprintf(b, "    config.training.steps = %d\n", r.Steps)
}
