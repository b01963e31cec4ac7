package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/parallel/sim/validate"
)

// TestValidateEmbedded: `validate` prints the tables of the embedded
// published runs, the shared table's skipped rows and the summaries, and
// --json holds the same report: printed as text, it is the text output.
func TestValidateEmbedded(t *testing.T) {
	text, err := runCmd(t, "validate")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"validation of " + validate.EmbeddedRuns, "uncalibrated |TPS error|: median", "rows of the shared table skipped",
		"calibrated on each series' small-scale runs", "skipped R184 (", "needs model type (Mixtral-8x22B)", "memory |error|: median", "predicted not to fit:"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	js, err := runCmd(t, "validate", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rep validate.Report
	if err := json.Unmarshal([]byte(js), &rep); err != nil {
		t.Fatal(err)
	}
	runs, err := validate.Published()
	if err != nil {
		t.Fatal(err)
	}
	if rep.Count != len(runs) || rep.Shared == nil || len(rep.Shared.Skipped) == 0 {
		t.Errorf("JSON: %d runs (want %d), shared table %v", rep.Count, len(runs), rep.Shared)
	}
	var b strings.Builder
	if err := validate.WriteText(&b, rep); err != nil {
		t.Fatal(err)
	}
	if b.String() != text {
		t.Errorf("the JSON report printed as text differs from the text output:\n%s\nvs\n%s", b.String(), text)
	}
}

// TestValidateRuns: --runs validates a file of one's own runs (source
// optional, a model path relative to the file) without the shared
// table's section.
func TestValidateRuns(t *testing.T) {
	dir := t.TempDir()
	cfg, err := os.ReadFile(filepath.Join("..", "..", "parallel", "sim", "validate", "testdata", "published", "models", "qwen3-32b.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "models"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "models", "q.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	runs := `[{"model": "models/q.json", "gpu": "h100-96gb", "gpus": 8, "dp_shard": 8, "dp_replicate": 1, "ep": 1, "ac": "full",
	"lbs": 2, "seq": 4096, "precision": "bf16", "tps": 1874, "framework": "torchtitan", "peak_reserved_bytes": 87885768294}]`
	path := filepath.Join(dir, "runs.json")
	if err := os.WriteFile(path, []byte(runs), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runCmd(t, "validate", "--runs", path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "validation of "+path+": 1 run(s)") || !strings.Contains(out, "q.json") || strings.Contains(out, "shared table") {
		t.Errorf("output:\n%s", out)
	}
	js, err := runCmd(t, "validate", "--runs", path, "--json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(js, "shared_table") {
		t.Errorf("--runs JSON has the shared table's section:\n%s", js)
	}
}

// TestValidateErrors: a missing or empty runs file, a run that cannot be
// predicted and a stray argument are errors that say which; only the
// last is a usage error.
func TestValidateErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	empty := write("empty.json", "[]")
	badGPU := write("bad.json", `[{"model": "llama3-8b", "gpu": "a100", "gpus": 8, "dp_shard": 8, "dp_replicate": 1, "ep": 1,
	"ac": "full", "lbs": 2, "seq": 4096, "precision": "bf16", "tps": 100, "run_id": "R9"}]`)
	for _, c := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"validate", "--runs", filepath.Join(dir, "none.json")}, "none.json: no such file", 1},
		{[]string{"validate", "--runs", empty}, "no runs to validate", 1},
		{[]string{"validate", "--runs", badGPU}, "run R9", 1},
		{[]string{"validate", "extra"}, `unexpected argument "extra"`, 2},
	} {
		_, err := runCmd(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) || exitCode(err) != c.code {
			t.Errorf("%v: %v; want exit %d and an error with %q", c.args, err, c.code, c.want)
		}
	}
}
