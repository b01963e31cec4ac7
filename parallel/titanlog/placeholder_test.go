package titanlog

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlaceholderRefused: a log whose printed config still holds an
// export's placeholder (here printed_config.log with the sweep's
// tokenizer placeholder put into its [model] section, as a run of an
// unfilled sweep job would print it) is refused, with or without a job
// config given for it, naming the key and its value; the log as shipped
// reads.
func TestPlaceholderRefused(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "printed_config.log"))
	if err != nil {
		t.Fatal(err)
	}
	const at = `[rank0]:    "flavor": "30B-A3B",` + "\n"
	if !strings.Contains(string(data), at) {
		t.Fatalf("printed_config.log has no line %q", at)
	}
	planted := strings.Replace(string(data), at, at+`[rank0]:    "hf_assets_path": "<FILL: folder of the model's Hugging Face tokenizer files>",`+"\n", 1)
	job, err := ReadJobConfig("testdata/rank0_colour.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range []*Job{nil, job} {
		lg, err := Parse("planted.log", []byte(planted))
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = Input{Log: lg, Job: j, Device: b200(t)}.Run()
		if err == nil || !strings.Contains(err.Error(), `model.hf_assets_path = "<FILL: folder of the model's Hugging Face tokenizer files>"`) ||
			!strings.Contains(err.Error(), "planted.log") {
			t.Errorf("job config %v: err = %v, want the placeholder named", j != nil, err)
		}
	}
	if _, _, err := (Input{Log: load(t, "printed_config.log"), Device: b200(t)}).Run(); err != nil {
		t.Errorf("printed_config.log as shipped: %v", err)
	}
	if k, v, ok := placeholderIn("", map[string]any{"a": []any{"x", map[string]any{"b": "<FILL: y>"}}}); !ok || k != "a[1].b" || v != "<FILL: y>" {
		t.Errorf("placeholderIn in a list: %q %q %v", k, v, ok)
	}
}
