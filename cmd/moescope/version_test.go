package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionText(t *testing.T) {
	info := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/moescope/moescope", Version: "v0.3.1"},
		Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0123abcd"},
			{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"}}}
	want := "moescope v0.3.1 (module github.com/moescope/moescope)\n" +
		"revision 0123abcd (2026-01-02T03:04:05Z), with uncommitted changes\n" +
		"built with go1.26.0\n"
	if got := versionText(info); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	info.Settings = nil
	got := versionText(info)
	for _, w := range []string{"revision unknown", "-buildvcs=false", "GOFLAGS", "-buildvcs=true"} {
		if !strings.Contains(got, w) {
			t.Errorf("without VCS settings: %q lacks %q", got, w)
		}
	}
}

func TestVersionFlagIsCommand(t *testing.T) {
	var a, b bytes.Buffer
	if err := run(&a, &b, []string{"version"}); err != nil {
		t.Fatal(err)
	}
	var c bytes.Buffer
	if err := run(&c, &b, []string{"--version"}); err != nil {
		t.Fatal(err)
	}
	if a.String() != c.String() || !strings.HasPrefix(a.String(), "moescope ") {
		t.Errorf("version %q and --version %q differ or lack the name", a.String(), c.String())
	}
	if err := run(&a, &b, []string{"version", "extra"}); err == nil {
		t.Error("version with an argument: no error")
	}
}

// TestVersionRevision builds the command as a user does, with go build in
// a fresh clone of this checkout's HEAD, and checks that it prints the
// revision git reports. -buildvcs=true overrides a GOFLAGS that turns
// stamping off (as on the build machines); the clone also avoids linked
// worktrees, in which the go command stamps nothing.
func TestVersionRevision(t *testing.T) {
	if testing.Short() {
		t.Skip("clones the repository and builds the command; skipped with -short")
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout (git rev-parse: %v): there is no revision to stamp", err)
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	clone := filepath.Join(tmp, "clone")
	if out, err := exec.Command("git", "clone", "-q", strings.TrimSpace(string(top)), clone).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	bin := filepath.Join(tmp, "moescope")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./cmd/moescope")
	build.Dir = clone
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build in the clone: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("moescope version (built from the committed HEAD): %v\n%s", err, out)
	}
	want := "revision " + strings.TrimSpace(string(head)) + " ("
	if !strings.Contains(string(out), want) {
		t.Errorf("moescope version printed\n%s\nwant a line starting %q", out, want)
	}
}
