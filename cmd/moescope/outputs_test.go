package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/internal/fileio"
)

func TestCheckOutputs(t *testing.T) {
	dir := t.TempDir()
	exists := filepath.Join(dir, "exists")
	if err := os.WriteFile(exists, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(dir, "fresh")
	if err := checkOutputs(false, output{"--a", fresh}, output{"--b", ""}, output{"--c", ""}); err != nil {
		t.Errorf("a new file in an existing directory, two unset flags: %v", err)
	}
	if err := checkOutputs(false, output{"--a", exists}); !errors.Is(err, fileio.ErrExists) {
		t.Errorf("existing file without force: %v, want ErrExists", err)
	}
	if err := checkOutputs(true, output{"--a", exists}); err != nil {
		t.Errorf("existing file with force: %v", err)
	}
	err := checkOutputs(true, output{"--a", fresh}, output{"--b", filepath.Join(dir, ".", "fresh")})
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--a and --b") {
		t.Errorf("one path named twice: %v, want a usage error naming both flags", err)
	}
	err = checkOutputs(false, output{"--a", filepath.Join(dir, "missing", "f")})
	if err == nil || !strings.Contains(err.Error(), "--a") || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing directory: %v", err)
	}
	err = checkOutputs(false, output{"--a", filepath.Join(exists, "f")})
	if err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Errorf("parent is a file: %v", err)
	}
	if b, _ := os.ReadFile(exists); string(b) != "keep" {
		t.Errorf("existing file changed: %q", b)
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
