package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/cost"
	"github.com/moescope/moescope/parallel/sim/published"
)

// tableRow is the whitespace-separated fields of the first line of out
// that starts with name.
func tableRow(t *testing.T, out, name string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			return f
		}
	}
	t.Fatalf("no row %q in:\n%s", name, out)
	return nil
}

// oneRunFile writes row i of a published runs file, its keys kept, as a
// runs file of its own.
func oneRunFile(t *testing.T, src string, i int, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var rows []json.RawMessage
	if err := json.Unmarshal(data, &rows); err != nil {
		t.Fatal(err)
	}
	doc, err := json.Marshal(rows[i : i+1])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, doc, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCalibrateTablePrintsFitted: one run fits compute_scale alone, and
// the table prints its value (it printed 0: the table's name → value map
// lacked compute_scale) and its spread. KempnerForge's Llama 3 8B on one
// H200 (parallel/sim/validate/testdata/published, row 0: 10,471 tokens/s) has no communication,
// so its TPS is proportional to the compute scale, ∂ ln TPS/∂x = 1, and
// the fit at σ = 2% against the prior's ln 2 gives
//
//	x  = ln(10471/predicted) · (1/σ²)/(1/σ² + 1/ln²2) = ln(10471/predicted) · 2500/2502.0814
//	sd = 1/√(2500 + 2.0814) = 0.019992, printed 2.0%
//
// and every parameter left at its default has no spread ("—").
func TestCalibrateTablePrintsFitted(t *testing.T) {
	dir := t.TempDir()
	runs, cal := filepath.Join(dir, "one.json"), filepath.Join(dir, "cal.json")
	oneRunFile(t, "../../parallel/sim/validate/testdata/published/kempnerforge-mfu-scaling-h200.json", 0, runs)
	out, err := runSimCmd(t, "calibrate", "--runs", runs, "--out", cal)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "rel. sd (√var ln θ)") {
		t.Errorf("no sd column header:\n%s", out)
	}
	row := tableRow(t, out, cost.CalCompute)
	if len(row) != 4 || row[3] != "fitted" {
		t.Fatalf("compute_scale row %q: want name, value, sd, fitted", row)
	}
	got, err := strconv.ParseFloat(row[1], 64)
	if err != nil || got == 0 {
		t.Fatalf("compute_scale printed %q: want the fitted value", row[1])
	}
	want := math.Exp(math.Log(10471/predictedTPS(t, runs)) * 2500 / 2502.0814)
	if math.Abs(got/want-1) > 1e-3 {
		t.Errorf("compute_scale printed %v, want %.4g", got, want)
	}
	if row[2] != "2.0%" {
		t.Errorf("compute_scale sd %q, want 2.0%%", row[2])
	}
	if row := tableRow(t, out, cost.CalGEMM); row[1] != "-" || row[2] != "—" {
		t.Errorf("kept gemm_scale row %q: want no value and sd —", row)
	}
	c, err := cost.ReadCalibration(cal)
	if err != nil {
		t.Fatal(err)
	}
	if strconv.FormatFloat(c.ComputeScale, 'g', 4, 64) != row[1] {
		t.Errorf("table %s, JSON compute_scale %v", row[1], c.ComputeScale)
	}
}

// predictedTPS is the uncalibrated prediction of the one run in path.
func predictedTPS(t *testing.T, path string) float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rs, err := published.ReadRuns(f, path, false)
	if err != nil {
		t.Fatal(err)
	}
	in, err := published.InputForRun(rs[0])
	if err != nil {
		t.Fatal(err)
	}
	res, err := sim.Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	return res.TPS
}

// TestCalibrateResidualsNamed: three Llama 3 8B runs, the first and third
// with a run_id (R1, R3), the second without: the table names each
// residual by its run_id, the second by the file and its position in the
// array (1, counted from 0), and the JSON keeps the positional residuals
// with the names beside them.
func TestCalibrateResidualsNamed(t *testing.T) {
	dir := t.TempDir()
	runs, cal := filepath.Join(dir, "runs.json"), filepath.Join(dir, "cal.json")
	const run = `{"model":"llama3-8b","gpu":"h100-96gb","gpus":8,"dp_shard":8,"dp_replicate":1,"ep":1,"seq":8192,"precision":"bf16",`
	doc := "[" + run + `"ac":"selective","lbs":2,"tps":6667,"run_id":"R1"},` +
		run + `"ac":"full","lbs":2,"tps":5800},` +
		run + `"ac":"full","lbs":4,"tps":6000,"run_id":"R3"}]`
	if err := os.WriteFile(runs, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runSimCmd(t, "calibrate", "--runs", runs, "--out", cal)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := []string{"R1", runs + "[1]", "R3"}
	_, table, ok := strings.Cut(out, "residuals (predicted / measured − 1):")
	if !ok {
		t.Fatalf("no residuals table:\n%s", out)
	}
	// stderr, after the table: the file written.
	table, wrote, _ := strings.Cut(table, "wrote ")
	if wrote != cal+" (calibration of 3 runs)\n" {
		t.Errorf("stderr: wrote %q, want %s (calibration of 3 runs)", wrote, cal)
	}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 1+len(want) {
		t.Fatalf("residuals table has %d lines, want a header and %d runs:\n%s", len(lines), len(want), table)
	}
	for i, name := range want {
		if f := strings.Fields(lines[1+i]); f[0] != name {
			t.Errorf("residual row %d named %q, want %q", i, f[0], name)
		}
	}
	c, err := cost.ReadCalibration(cal)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.ResidualRuns, want) || len(c.Residuals) != len(want) {
		t.Errorf("JSON residual_runs %q for %d residuals, want %q", c.ResidualRuns, len(c.Residuals), want)
	}
}
