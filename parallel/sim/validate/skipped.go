package validate

import (
	"bytes"
	"cmp"
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/published"
)

// The shared validation table (published_runs.csv, a copy of the
// project's; testdata/validation/README.md describes its columns) lists
// runs moescope cannot express yet; the validation prints each with the
// first feature it needs, so that what is left out is visible next to
// what is predicted.

// SharedTable is the shared validation table's part of a validation: its
// rows that are not among the runs predicted (by run_id), each with what
// it needs.
type SharedTable struct {
	Rows    int          `json:"rows"`
	Skipped []SkippedRow `json:"skipped"`
}

// SkippedRow is a row of the shared table left out of the validation, in
// the table's own words (its n_gpus is free text: "256 (text also says
// 512)").
type SkippedRow struct {
	RunID     string `json:"run_id"`
	Framework string `json:"framework"`
	Model     string `json:"model"`
	GPU       string `json:"gpu"`
	GPUs      string `json:"n_gpus"`
	Needs     string `json:"needs"`
}

// notTranscribed is what a skipped row expressible today needs.
const notTranscribed = "expressible, not yet transcribed into testdata/published (layout or batch not stated)"

// tableColumns are the shared table's columns the validation reads.
var tableColumns = []string{"run_id", "framework", "model", "gpu", "n_gpus", "cp", "precision", "recompute"}

// maxTableBytes bounds what ReadTable reads: the table is a few hundred
// KiB; a device or pipe must not be read forever.
const maxTableBytes = 16 << 20

// ReadTable reads the shared table's CSV, header first, and checks that
// the header names the columns the validation reads.
func ReadTable(r io.Reader) ([][]string, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxTableBytes+1))
	if err != nil {
		return nil, fmt.Errorf("shared validation table: %w", err)
	}
	if len(data) > maxTableBytes {
		return nil, fmt.Errorf("shared validation table: larger than %d bytes", maxTableBytes)
	}
	recs, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("shared validation table: %w", err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("shared validation table: empty (want a header row naming %s)", strings.Join(tableColumns, ", "))
	}
	for _, c := range tableColumns {
		if !slices.Contains(recs[0], c) {
			return nil, fmt.Errorf("shared validation table: no %q column in its header", c)
		}
	}
	return recs, nil
}

// Shared lists the rows of table (ReadTable's records, header first)
// whose run_id is not among runs, each with the first feature it needs.
func Shared(runs []published.Run, table [][]string) SharedTable {
	have := map[string]bool{}
	for _, r := range runs {
		have[r.RunID] = true
	}
	t := SharedTable{Rows: len(table) - 1}
	for _, rec := range table[1:] {
		row := map[string]string{}
		for i, k := range table[0] {
			row[k] = rec[i]
		}
		if have[row["run_id"]] {
			continue
		}
		t.Skipped = append(t.Skipped, SkippedRow{RunID: row["run_id"], Framework: row["framework"], Model: row["model"],
			GPU: row["gpu"], GPUs: row["n_gpus"], Needs: cmp.Or(neededFeature(row), notTranscribed)})
	}
	return t
}

// builtinOfCSV maps the table's model names to built-in models. The
// table's Kimi-K2 rows describe torchtitan's Kimi-K2.5 text model, which
// the table takes as Kimi-K2's language model (its shape columns are the
// kimi-k2 built-in's: 61 layers, 64 heads, 384 experts of 2048, top 8, one
// dense layer, vocabulary 163840). Its Llama3-70B rows include Llama 3.1
// 70B runs (R163's recipe is named so); 3 and 3.1 share every shape the
// accounting reads (the table's columns: 80 layers, 8192 wide, 64 heads, 8
// KV heads, FFN 28672, vocabulary 128256) and differ only in RoPE scaling.
var builtinOfCSV = map[string]string{"Qwen3-30B-A3B": "qwen3-30b-a3b", "Qwen3-235B-A22B": "qwen3-235b-a22b",
	"Llama3-8B": "llama3-8b", "Llama3-70B": "llama3-70b", "Llama3.1-405B": "llama3.1-405b",
	"Mixtral-8x7B": "mixtral-8x7b", "DeepSeek-V3": "deepseek-v3", "Kimi-K2": "kimi-k2",
	"GPT-OSS-120B": "gpt-oss-120b", "GPT-OSS-20B": "gpt-oss-20b"}

// neededFeature is the first feature a row of the shared table needs that
// moescope lacks: a precision other than a priced
// recipe, a model type, a Megatron-Core recompute module not built (the
// table writes --recompute-modules as "selective: layernorm, moe_act" and
// the like), or activation offloading to host memory (its recompute column
// names it: "CPU activation offloading of 40 layers to Grace memory");
// "" when it needs none of them (tensor, context and pipeline parallelism
// are built, alone and together).
func neededFeature(row map[string]string) string {
	if p, err := (published.Run{Precision: row["precision"]}).PrecisionRecipe(); err != nil || p.Check("precision") != nil {
		return "FP8 / FP4 recipe (" + strings.SplitN(row["precision"], " ", 2)[0] + ")"
	}
	if gpu := strings.ToLower(strings.SplitN(strings.TrimSpace(row["gpu"]), " ", 2)[0]); gpu != "" {
		if _, err := hw.LookupDevice(gpu); err != nil {
			return "device (" + row["gpu"] + ": not in the registry)"
		}
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
	if strings.Contains(strings.ToLower(row["recompute"]), "offload") {
		return "activation offloading"
	}
	return ""
}
