package published

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

// runJSON is one valid run whose model is the config.json at model.
func runJSON(model string) string {
	return `[{"model": "` + model + `", "gpu": "h100-96gb", "gpus": 8, "dp_shard": 8, "dp_replicate": 1, "ep": 1,
	"ac": "full", "lbs": 2, "seq": 4096, "precision": "bf16", "tps": 1874, "source": "test"}]`
}

// TestLoadFSModelPath: a run in a file system (the embedded runs) names
// its model relative to its file's folder, and the model is read from
// that file system, not from disk.
func TestLoadFSModelPath(t *testing.T) {
	cfg, err := os.ReadFile("../validate/testdata/published/models/qwen3-32b.json")
	if err != nil {
		t.Fatal(err)
	}
	fsys := fstest.MapFS{
		"runs/a.json":                {Data: []byte(runJSON("models/qwen3-32b.json"))},
		"runs/models/qwen3-32b.json": {Data: cfg},
		"runs/b.json":                {Data: []byte(runJSON("llama3-8b"))},
	}
	runs, err := LoadFS(fsys, "runs")
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].File != "runs/a.json" || runs[1].File != "runs/b.json" {
		t.Fatalf("runs %d, files %q, %q; want runs/a.json then runs/b.json", len(runs), runs[0].File, runs[1].File)
	}
	if runs[0].Model != "runs/models/qwen3-32b.json" || runs[1].Model != "llama3-8b" {
		t.Errorf("models %q, %q; want runs/models/qwen3-32b.json (relative to the file) and llama3-8b (built-in)", runs[0].Model, runs[1].Model)
	}
	for _, r := range runs {
		if _, err := r.LoadModel(); err != nil {
			t.Errorf("%s: %v", r.Model, err)
		}
		if _, err := InputForRun(r); err != nil {
			t.Errorf("%s: InputForRun: %v", r.Model, err)
		}
	}
	delete(fsys, "runs/models/qwen3-32b.json")
	runs, err = LoadFS(fsys, "runs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runs[0].LoadModel(); err == nil || !strings.Contains(err.Error(), "runs/models/qwen3-32b.json") {
		t.Errorf("missing model: %v; want an error naming its path", err)
	}
}

// TestReadFileModelPath: a runs file read from disk names its model
// relative to the file's folder, as `calibrate --runs` reads it.
func TestReadFileModelPath(t *testing.T) {
	dir := t.TempDir()
	cfg, err := os.ReadFile("../validate/testdata/published/models/qwen3-32b.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "models"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "models", "q.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "runs.json")
	if err := os.WriteFile(file, []byte(runJSON("models/q.json")), 0o644); err != nil {
		t.Fatal(err)
	}
	runs, err := ReadFile(file, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "models", "q.json"); runs[0].Model != want {
		t.Errorf("model %q, want %q", runs[0].Model, want)
	}
	if _, err := runs[0].LoadModel(); err != nil {
		t.Error(err)
	}
	if _, err := ReadFile(dir, true); err == nil {
		t.Error("a folder read as a runs file")
	}
}
