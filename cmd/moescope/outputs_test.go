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

// TestForceNeverDeletesUnmarkedDirectory: train --checkpoint DIR --force
// used to os.RemoveAll whatever DIR named: `..` from a subdirectory deleted
// its siblings, and any existing tree was wiped. Now --force replaces only
// a checkpoint moescope wrote (its marker file), never the working
// directory or an ancestor, and the old checkpoint goes only once the new
// one is in place.
func TestForceNeverDeletesUnmarkedDirectory(t *testing.T) {
	root := t.TempDir()
	precious := filepath.Join(root, "precious")
	if err := os.MkdirAll(filepath.Join(precious, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(precious, "keep.txt")
	if err := os.WriteFile(keep, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"train", "--model", "tiny", "--peak-gflops", "100", "--gpus", "1", "--lbs", "1", "--seq", "8", "--steps", "1", "--force"}
	train := func(ck string) error {
		var out, errb bytes.Buffer
		return run(&out, &errb, append(base, "--checkpoint", ck))
	}
	if err := train(precious); err == nil || !strings.Contains(err.Error(), "moescope did not write it") {
		t.Errorf("--checkpoint over a directory of the user's: %v", err)
	}
	t.Chdir(filepath.Join(precious, "sub"))
	for _, ck := range []string{"..", ".", filepath.Join(precious, "sub")} {
		if err := train(ck); err == nil || !strings.Contains(err.Error(), "never replaced") {
			t.Errorf("--checkpoint %s: %v", ck, err)
		}
	}
	if b, err := os.ReadFile(keep); err != nil || string(b) != "mine" {
		t.Fatalf("the user's file is gone or changed: %q, %v", b, err)
	}
	// A checkpoint moescope wrote is replaced, and the result loads.
	ck := filepath.Join(root, "ck")
	for i := 0; i < 2; i++ {
		if err := train(ck); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	if _, err := os.Stat(filepath.Join(ck, "train_state.json")); err != nil {
		t.Errorf("replaced checkpoint: %v", err)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 2 {
		t.Errorf("%d entries beside the checkpoint, want none left aside: %v", len(ents)-2, ents)
	}
}

// TestOutputNeverOverwritesInput: an output flag that names one of the
// command's inputs is refused, even with --force (grad --save T --tokens T
// and calibrate --runs R --out R used to overwrite their inputs).
func TestOutputNeverOverwritesInput(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(tokens, []byte("[[1,2,3]]"), 0o644); err != nil {
		t.Fatal(err)
	}
	runs, err := os.ReadFile(filepath.Join("..", "..", "parallel", "sim", "validate", "testdata", "published", "pith-train-issue79-qwen3-30b-a3b-b200.json"))
	if err != nil {
		t.Fatal(err)
	}
	runsPath := filepath.Join(dir, "runs.json")
	if err := os.WriteFile(runsPath, runs, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(runsPath, link); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"grad", "--model", "tiny", "--init", "1", "--save", tokens, "--tokens", tokens, "--force"},
		{"grad", "--model", "tiny", "--init", "1", "--tokens", tokens, "--out", filepath.Join(dir, ".", "tokens.json"), "--force"},
		{"calibrate", "--runs", runsPath, "--out", runsPath, "--force"},
		{"calibrate", "--runs", link, "--out", runsPath, "--force"}, // the same file by inode
	} {
		_, err := runCmd(t, args...)
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "name the same path") {
			t.Errorf("%v: %v, want a usage error naming both flags", args, err)
		}
	}
	if b, _ := os.ReadFile(tokens); string(b) != "[[1,2,3]]" {
		t.Errorf("tokens changed: %q", b)
	}
	if b, _ := os.ReadFile(runsPath); !bytes.Equal(b, runs) {
		t.Error("runs file changed")
	}
}

// TestForceNeverReplacesDevice: --force replaces regular files only; a
// character device (here /dev/null), a FIFO or a directory named as an
// output is refused and left as it was.
func TestForceNeverReplacesDevice(t *testing.T) {
	dir := t.TempDir()
	runsPath := filepath.Join("..", "..", "parallel", "sim", "validate", "testdata", "published", "pith-train-issue79-qwen3-30b-a3b-b200.json")
	for _, out := range []string{"/dev/null", dir} {
		_, err := runCmd(t, "calibrate", "--runs", runsPath, "--out", out, "--force")
		if err == nil || !strings.Contains(err.Error(), "--force replaces only regular files") {
			t.Errorf("--out %s: %v", out, err)
		}
	}
	if st, err := os.Stat("/dev/null"); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		t.Errorf("/dev/null is no longer a character device: %v %v", st, err)
	}
}
