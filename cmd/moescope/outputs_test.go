package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckOutputsUsage: one path named by two flags is a usage error
// (exit status 2) naming both; fileio's tests cover the other refusals.
func TestCheckOutputsUsage(t *testing.T) {
	p := filepath.Join(t.TempDir(), "fresh")
	err := checkOutputs(true, output{Flag: "--a", Path: p}, output{Flag: "--b", Path: p})
	if !errors.Is(err, errUsage) || exitCode(err) != 2 || !strings.Contains(err.Error(), "--a and --b") {
		t.Errorf("one path named twice: %v, want a usage error naming both flags", err)
	}
}

// TestOutputsRefusedBeforeWork: each command that writes files refuses an
// output it could not write before doing its work (the tiny model keeps
// the work short should a refusal come late; the output then shows it).
func TestOutputsRefusedBeforeWork(t *testing.T) {
	dir := t.TempDir()
	exists := filepath.Join(dir, "exists")
	if err := os.WriteFile(exists, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing", "f")
	sim := []string{"simulate", "--model", "tiny", "--gpus", "4", "--lbs", "1", "--seq", "64"}
	plan := []string{"plan", "--model", "tiny", "--gpus", "8", "--seq", "64"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(sim, "--trace", missing), "does not exist"},
		{append(sim, "--trace-ranks", "1"), "--trace-ranks needs --trace"},
		{[]string{"calibrate", "--runs", filepath.Join(dir, "none.json"), "--out", missing}, "does not exist"},
		{append(plan, "--torchtitan-toml", missing), "does not exist"},
		{append(plan, "--torchtitan-py", missing), "does not exist"},
		{append(plan, "--trace", missing), "does not exist"},
		{append(plan, "--torchtitan-toml", filepath.Join(dir, "x"), "--torchtitan-py", filepath.Join(dir, "x")), "name the same path"},
		{append(plan, "--plot", exists), "is not a directory"},
		{append(plan, "--plot", filepath.Join(exists, "sub", "sub")), "is not a directory"},
		{[]string{"bench", "--no-gemm", "--tokens", "8", "--cpuprofile", exists}, "file exists"},
		{[]string{"bench", "--no-gemm", "--tokens", "8", "--cpuprofile", missing}, "does not exist"},
		{[]string{"bench", "--no-layer", "--cpuprofile", filepath.Join(dir, "p")}, "--no-layer"},
	} {
		var out, errb bytes.Buffer
		err := run(&out, &errb, c.args)
		if err == nil || exitCode(err) == 0 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want one containing %q", c.args, err, c.want)
		}
		if out.Len() > 0 {
			t.Errorf("%v: worked before refusing:\n%s", c.args, out.String())
		}
	}
	if b, _ := os.ReadFile(exists); string(b) != "keep" {
		t.Errorf("existing file changed: %q", b)
	}
}
