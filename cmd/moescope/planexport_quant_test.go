package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlanExportLowPrecision: plan's exports write the searched recipe's
// converters, the search leaves out what v0.2.2 cannot run under the
// recipe (MX linears with tp > 1 under compile) and says so, and a recipe
// an export cannot write is refused before the search, naming the export
// flag and the precision.
func TestPlanExportLowPrecision(t *testing.T) {
	dir := t.TempDir()
	toml, py := filepath.Join(dir, "p.toml"), filepath.Join(dir, "p.py")
	out, err := runSimCmd(t, "plan", "--model", "tiny", "--gpu", "b200", "--gpus", "4", "--seq", "256", "--max-lbs", "8",
		"--precision", "mxfp8", "--tp", "1,2", "--torchtitan-toml", toml, "--torchtitan-py", py)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "× precision = mxfp8 converting linear,experts with tp = N and a compiled model: ") {
		t.Errorf("no narrowing by the MX converter:\n%s", out)
	}
	b, err := os.ReadFile(toml)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"converters = [\"quantize.linear.mx\", \"quantize.grouped_mm.mx\"]\n", "tensor_parallel_degree = 1\n", "[quantize.grouped_mm.mx]\n"} {
		if !strings.Contains(string(b), w) {
			t.Errorf("%s lacks %q:\n%s", toml, w, b)
		}
	}
	if b, err = os.ReadFile(py); err != nil || !strings.Contains(string(b), "MXFP8GroupedExpertsConverter.Config(") {
		t.Errorf("%s: %v\n%s", py, err, b)
	}
	for _, c := range []struct{ flag, file, precision, want string }{
		{"--torchtitan-toml", "r.toml", "fp8-current", "--torchtitan-toml: --precision = fp8-current"},
		{"--torchtitan-py", "r.py", "fp8-tensorwise", "--torchtitan-py: --precision = fp8-tensorwise"},
	} {
		out, err := runSimCmd(t, "plan", "--model", "tiny", "--gpu", "b200", "--gpus", "4", "--seq", "256", "--precision", c.precision, c.flag, filepath.Join(dir, c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: %v, want %q\n%s", c.flag, c.precision, err, c.want, out)
		}
		if _, err := os.Stat(filepath.Join(dir, c.file)); err == nil {
			t.Errorf("%s: a refused export wrote %s", c.flag, c.file)
		}
	}
}
