package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moescope/moescope/parallel/sim/cost"
	"github.com/moescope/moescope/parallel/sim/published"
)

const titanData = "../../parallel/titanlog/testdata/"

// TestCalibrateLogEqualsRunsFile: a log in torchtitan's format (colours,
// [rank0]: prefixes, logger headers) with its TOML job config calibrates
// exactly as the runs file written by hand from the same numbers: tps
// 31,057 (the median of steps 2–10, listed in the titanlog tests), peak
// 141.27 GiB = 151,687,507,476 bytes, the layout of the TOML.
func TestCalibrateLogEqualsRunsFile(t *testing.T) {
	dir := t.TempDir()
	runs := `[{"model": "qwen3-30b-a3b", "gpu": "b200", "gpus": 8, "dp_shard": 8, "dp_replicate": 1, "ep": 1, "ac": "selective",
	  "lbs": 4, "seq": 4096, "precision": "bf16", "tps": 31057, "source": "by hand", "reshard_after_forward": true,
	  "grad_accum": 1, "compile": true, "peak_reserved_bytes": 151687507476}]`
	runsPath := filepath.Join(dir, "runs.json")
	if err := os.WriteFile(runsPath, []byte(runs), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(&out, &out, []string{"calibrate", "--runs", runsPath, "--out", filepath.Join(dir, "a.json")}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if err := run(&out, &out, []string{"calibrate", "--torchtitan-log", titanData + "rank0_colour.log", "--job-config", titanData + "rank0_colour.toml",
		"--runs-out", filepath.Join(dir, "logruns.json"), "--out", filepath.Join(dir, "b.json")}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	a, err := cost.ReadCalibration(filepath.Join(dir, "a.json"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := cost.ReadCalibration(filepath.Join(dir, "b.json"))
	if err != nil {
		t.Fatal(err)
	}
	// Each names its run by where it came from: the runs file and the
	// run's position, the log file.
	if want := []string{runsPath + "[0]"}; !slices.Equal(a.ResidualRuns, want) {
		t.Errorf("runs file: residual_runs %q, want %q", a.ResidualRuns, want)
	}
	if want := []string{titanData + "rank0_colour.log"}; !slices.Equal(b.ResidualRuns, want) {
		t.Errorf("log: residual_runs %q, want %q", b.ResidualRuns, want)
	}
	if !strings.Contains(out.String(), titanData+"rank0_colour.log  ") {
		t.Errorf("the residuals table does not name the log:\n%s", out.String())
	}
	a.Source, b.Source = "", ""
	a.ResidualRuns, b.ResidualRuns = nil, nil
	ja, _ := marshalJSON("t", a, "")
	jb, _ := marshalJSON("t", b, "")
	if !bytes.Equal(ja, jb) {
		t.Errorf("calibrations differ:\nruns file %s\nlog       %s", ja, jb)
	}
	if len(a.Fitted) == 0 {
		t.Errorf("nothing fitted: the comparison is empty")
	}
}

func TestCalibrateLogFlags(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "c.json")
	existing := filepath.Join(dir, "mine.json")
	os.WriteFile(existing, []byte("keep"), 0o644)
	log, toml := titanData+"rank0_colour.log", titanData+"rank0_colour.toml"
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--out", out}, "--runs or --torchtitan-log is required"},
		{[]string{"--torchtitan-log", log, log, "--job-config", toml, "--runs-out", filepath.Join(dir, "r.json"), "--out", out}, "given 1 time(s) for 2 log(s)"},
		{[]string{"--torchtitan-log", log, "--skip-steps", "-1", "--runs-out", filepath.Join(dir, "r.json"), "--out", out}, "--skip-steps = -1"},
		{[]string{"--runs", existing, "--skip-steps", "2", "--out", out}, "go with --torchtitan-log"},
		{[]string{"--torchtitan-log", log, "--job-config", toml, "--runs-out", existing, "--out", out}, "exists"},
		{[]string{"--torchtitan-log", titanData + "no_steady.log", "--job-config", toml, "--runs-out", filepath.Join(dir, "r.json"), "--out", out}, "no steady steps"},
		{[]string{"--torchtitan-log", titanData + "disagrees.log", "--job-config", toml, "--runs-out", filepath.Join(dir, "r.json"), "--out", out}, "disagree"},
	}
	for _, c := range cases {
		var buf bytes.Buffer
		err := run(&buf, &buf, append([]string{"calibrate"}, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want %q", c.args, err, c.want)
		}
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep" {
		t.Errorf("a refused run overwrote %s", existing)
	}
	for _, p := range []string{out, filepath.Join(dir, "r.json")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s written by a run that failed", p)
		}
	}
}

// TestCalibrateLogsSwapped: stated_b4.log states local batch 4, global 32
// (its config rank0_colour.toml), stated_b2.log local 2, global 16
// (stated_b2.toml), each at line 5 (parallel/titanlog/testdata). Given
// the configs in the other order, calibrate is refused with a usage error
// naming the first log, its config given, the field and both values, and
// writes nothing.
func TestCalibrateLogsSwapped(t *testing.T) {
	dir := t.TempDir()
	out, runsOut := filepath.Join(dir, "c.json"), filepath.Join(dir, "r.json")
	var buf bytes.Buffer
	err := run(&buf, &buf, []string{"calibrate", "--torchtitan-log", titanData + "stated_b4.log", titanData + "stated_b2.log",
		"--job-config", titanData + "stated_b2.toml", "--job-config", titanData + "rank0_colour.toml", "--runs-out", runsOut, "--out", out})
	if !errors.Is(err, errUsage) || exitCode(err) != 2 {
		t.Fatalf("err = %v (exit %d), want a usage error (exit 2)", err, exitCode(err))
	}
	for _, w := range []string{
		"log " + titanData + "stated_b4.log, job config " + titanData + "stated_b2.toml",
		"local batch size: 4 in " + titanData + "stated_b4.log (line 5), 2 in " + titanData + "stated_b2.toml",
		"global batch size: 32 in " + titanData + "stated_b4.log (line 5), 16 in " + titanData + "stated_b2.toml",
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("err = %v\nwant %q", err, w)
		}
	}
	for _, p := range []string{out, runsOut} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s written by a refused run", p)
		}
	}
}

// TestCalibrateLogsWrote: in the logs' order the same files calibrate,
// with no --runs-out (nothing but the calibration written, and stderr
// says so) and with one (both named, with the two runs).
func TestCalibrateLogsWrote(t *testing.T) {
	dir := t.TempDir()
	args := []string{"calibrate", "--torchtitan-log", titanData + "stated_b4.log", titanData + "stated_b2.log",
		"--job-config", titanData + "rank0_colour.toml", "--job-config", titanData + "stated_b2.toml"}
	out := filepath.Join(dir, "c.json")
	var stdout, stderr bytes.Buffer
	if err := run(&stdout, &stderr, append(args, "--out", out)); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if got, want := stderr.String(), "wrote "+out+" (calibration of 2 runs)\n"; got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d files in %s, want only the calibration", len(entries), dir)
	}
	cal, err := cost.ReadCalibration(out)
	if err != nil {
		t.Fatal(err)
	}
	if want := titanData + "stated_b4.log"; len(cal.ResidualRuns) != 2 || cal.ResidualRuns[0] != want || strings.Contains(cal.Source, "runs in") {
		t.Errorf("residual_runs %q, source %q", cal.ResidualRuns, cal.Source)
	}

	out2, runsOut := filepath.Join(dir, "c2.json"), filepath.Join(dir, "r.json")
	stdout.Reset()
	stderr.Reset()
	if err := run(&stdout, &stderr, append(args, "--runs-out", runsOut, "--out", out2, "--json")); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if got, want := stderr.String(), "wrote "+runsOut+" (2 runs)\nwrote "+out2+" (calibration of 2 runs)\n"; got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
	if strings.Contains(stdout.String(), "wrote") {
		t.Errorf("--json: stdout holds more than the calibration:\n%s", stdout.String())
	}
	runs, err := published.ReadFile(runsOut, false)
	if err != nil || len(runs) != 2 || runs[0].LBS != 4 || runs[1].LBS != 2 {
		t.Errorf("runs file: %+v, %v: want lbs 4 then 2", runs, err)
	}
}
