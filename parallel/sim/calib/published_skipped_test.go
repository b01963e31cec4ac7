package calib

import (
	"cmp"
	"encoding/csv"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/parallel/sim/published"
)

// The shared validation table (parallel/sim/validate/testdata/validation/published_runs.csv, a
// copy of the project's published_runs.csv) lists runs moescope cannot
// express yet; the validation table prints each with the first feature it
// needs, so that what is left out is visible next to what is predicted.

// builtinOfCSV maps the table's model names to built-in models. The
// table's Kimi-K2 rows describe torchtitan's Kimi-K2.5 text model, which
// the table takes as Kimi-K2's language model (its shape columns are the
// kimi-k2 built-in's: 61 layers, 64 heads, 384 experts of 2048, top 8, one
// dense layer, vocabulary 163840).
var builtinOfCSV = map[string]string{"Qwen3-30B-A3B": "qwen3-30b-a3b", "Qwen3-235B-A22B": "qwen3-235b-a22b",
	"Llama3-8B": "llama3-8b", "Mixtral-8x7B": "mixtral-8x7b", "DeepSeek-V3": "deepseek-v3", "Kimi-K2": "kimi-k2"}

// neededFeature is the first feature a row of the shared table needs that
// moescope lacks: context parallelism, a precision other than BF16, a
// model type, or a Megatron-Core recompute module not built (the table
// writes --recompute-modules as "selective: layernorm, moe_act" and the
// like); "" when it needs none of them (tensor and pipeline parallelism are
// built, alone and together).
func neededFeature(row map[string]string) string {
	deg := func(k string) bool {
		v := strings.TrimSpace(row[k])
		return v != "" && v != "1" && v != "-"
	}
	switch {
	case deg("cp"):
		return "CP (cp = " + row["cp"] + ")"
	}
	if p, err := (published.Run{Precision: row["precision"]}).PrecisionRecipe(); err != nil || p.Check("precision") != nil {
		return "FP8 / FP4 recipe (" + strings.SplitN(row["precision"], " ", 2)[0] + ")"
	}
	if _, ok := builtinOfCSV[row["model"]]; !ok {
		return "model type (" + row["model"] + ")"
	}
	if _, err := hf.Load(builtinOfCSV[row["model"]]); err != nil {
		return "model type (" + row["model"] + ")"
	}
	if rest, ok := strings.CutPrefix(row["recompute"], "selective: "); ok {
		mods := strings.SplitN(rest, " (", 2)[0]
		var names []string
		for _, m := range strings.Split(mods, ", ") {
			// The ModelZoo's H100 table abbreviates its run script's
			// --recompute-modules moe_act layernorm as "norm, act"
			// (yanring/Megatron-MoE-ModelZoo e865051,
			// best_practice/qwen3/run_h100_235b.sh).
			names = append(names, cmp.Or(map[string]string{"norm": "layernorm", "act": "moe_act"}[m], m))
		}
		if _, err := moe.ParseAC("modules:" + strings.Join(names, ",")); err != nil {
			return "Megatron recompute modules (" + mods + ")"
		}
	}
	return ""
}

// skippedRuns returns a line for each row of the shared table that is not
// in the published runs (by run_id) and the number of them.
func skippedRuns(t *testing.T, runs []published.Run) (string, int) {
	f, err := os.Open("../validate/testdata/validation/published_runs.csv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, r := range runs {
		have[r.RunID] = true
	}
	var b strings.Builder
	n := 0
	for _, rec := range recs[1:] {
		row := map[string]string{}
		for i, k := range recs[0] {
			row[k] = rec[i]
		}
		if have[row["run_id"]] {
			continue
		}
		need := neededFeature(row)
		if need == "" {
			need = "expressible, not yet transcribed into testdata/published (layout or batch not stated)"
		}
		n++
		fmt.Fprintf(&b, "skipped %-5s %-20.20s %-18.18s %-6.6s %5s GPUs: needs %s\n", row["run_id"], row["framework"], row["model"], row["gpu"], row["n_gpus"], need)
	}
	return b.String(), n
}

// TestNeededFeature: hand-made rows of the shared table's columns.
func TestNeededFeature(t *testing.T) {
	for _, c := range []struct {
		row  map[string]string
		want string
	}{
		{map[string]string{"tp": "2", "pp": "1", "precision": "BF16", "model": "Qwen3-235B-A22B"}, ""},
		{map[string]string{"tp": "2", "pp": "1", "precision": "MXFP8 (params)", "model": "Qwen3-235B-A22B"}, ""}, // mxfp8 is priced
		{map[string]string{"tp": "2", "pp": "1", "precision": "NVFP4", "model": "Qwen3-235B-A22B"}, "FP8 / FP4 recipe (NVFP4)"},
		{map[string]string{"precision": "FP8 (fine-grained 1x128/128x128)", "model": "DeepSeek-V3"}, "FP8 / FP4 recipe (FP8)"},
		{map[string]string{"tp": "1", "pp": "8", "precision": "BF16", "model": "Qwen3-235B-A22B"}, ""},
		{map[string]string{"tp": "2", "pp": "8", "precision": "BF16", "model": "Qwen3-235B-A22B"}, ""},                                      // tp inside pipeline stages is built
		{map[string]string{"tp": "2", "pp": "8", "precision": "BF16", "model": "Qwen3-235B-A22B", "recompute": "selective: norm, act"}, ""}, // modules:layernorm,moe_act is built
		{map[string]string{"tp": "1", "pp": "8", "precision": "BF16", "model": "Qwen3-235B-A22B", "recompute": "selective: layernorm, moe_act (perf recipe @HEAD)"}, ""},
		{map[string]string{"tp": "4", "pp": "8", "precision": "BF16", "model": "Qwen3-235B-A22B", "recompute": "selective: layernorm, moe (from command in source)"}, ""}, // modules:layernorm,moe is built (R145)
		{map[string]string{"tp": "1", "precision": "BF16", "model": "DeepSeek-V3", "recompute": "selective: mla_up_proj (perf recipe @HEAD)"}, "Megatron recompute modules (mla_up_proj)"},
		{map[string]string{"tp": "2", "pp": "8", "precision": "FP8-CS", "model": "Qwen3-235B-A22B", "recompute": "selective: norm, act"}, ""},
		{map[string]string{"tp": "", "pp": "", "cp": "", "precision": "MXFP8", "model": "Qwen3-30B-A3B"}, ""},
		{map[string]string{"tp": "1", "precision": "BF16", "model": "GPT-OSS-120B"}, "model type (GPT-OSS-120B)"},
		{map[string]string{"tp": "1", "precision": "BF16", "model": "Qwen3-30B-A3B"}, ""},
		{map[string]string{"tp": "1", "pp": "1", "cp": "1", "precision": "BF16", "model": "DeepSeek-V3"}, ""},
		{map[string]string{"tp": "1", "pp": "8", "precision": "BF16", "model": "Kimi-K2"}, ""}, // pipelines are built
		{map[string]string{"tp": "1", "pp": "8", "precision": "BF16", "model": "GPT-OSS-120B"}, "model type (GPT-OSS-120B)"},
		{map[string]string{"tp": "", "precision": "BF16 baseline", "model": "Kimi-K2"}, ""},
	} {
		if got := neededFeature(c.row); got != c.want {
			t.Errorf("%v: %q, want %q", c.row, got, c.want)
		}
	}
}
