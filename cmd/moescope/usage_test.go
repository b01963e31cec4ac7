package main

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestEveryCommandHasHelp: each registered command has a synopsis and one
// or two examples, all of them its own command lines.
func TestEveryCommandHasHelp(t *testing.T) {
	if got, want := slices.Sorted(maps.Keys(helps)), slices.Sorted(maps.Keys(commands)); !slices.Equal(got, want) {
		t.Fatalf("help texts for %v, commands %v", got, want)
	}
	for name, h := range helps {
		if !strings.HasPrefix(h.synopsis, "moescope "+name) {
			t.Errorf("%s: synopsis %q is not the command's", name, h.synopsis)
		}
		if n := len(h.examples); n < 1 || n > 2 {
			t.Errorf("%s: %d examples, want 1 or 2", name, n)
		}
		for _, e := range h.examples {
			if f := strings.Fields(e); len(f) < 2 || f[0] != "moescope" || f[1] != name {
				t.Errorf("%s: example %q is not a moescope %s command line", name, e, name)
			}
		}
	}
}

// TestHelpOnStdout: `CMD --help`, `CMD -h` and `help CMD` print the same
// usage, synopsis and examples first, on stdout, and succeed (exit 0).
func TestHelpOnStdout(t *testing.T) {
	for name := range commands {
		var first string
		for _, args := range [][]string{{name, "--help"}, {name, "-h"}, {"help", name}} {
			var out, errb bytes.Buffer
			if err := run(&out, &errb, args); err != nil {
				t.Errorf("%v: %v", args, err)
				continue
			}
			if errb.Len() > 0 {
				t.Errorf("%v: wrote to stderr: %q", args, errb.String())
			}
			got := out.String()
			if !strings.HasPrefix(got, "usage: "+helps[name].synopsis+"\n") || !strings.Contains(got, "\nexamples:\n  moescope "+name) {
				t.Errorf("%v: does not open with the synopsis and examples:\n%s", args, got)
			}
			if name != "version" && !strings.Contains(got, "\nflags:\n  -") {
				t.Errorf("%v: lists no flags:\n%s", args, got)
			}
			if first == "" {
				first = got
			} else if got != first {
				t.Errorf("%v differs from %s --help:\n%s", args, name, got)
			}
		}
	}
}

func TestHelpTopLevel(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		var out, errb bytes.Buffer
		if err := run(&out, &errb, args); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if !strings.HasPrefix(out.String(), "usage: moescope COMMAND") || !strings.Contains(out.String(), "  simulate ") {
			t.Errorf("%v: not the top-level usage:\n%s", args, out.String())
		}
	}
	for _, args := range [][]string{{"help", "nope"}, {"help", "plan", "simulate"}} {
		var out, errb bytes.Buffer
		if err := run(&out, &errb, args); exitCode(err) != 2 || out.Len() > 0 {
			t.Errorf("%v: err %v (exit %d), stdout %q; want a usage error and nothing printed", args, err, exitCode(err), out.String())
		}
	}
}

// TestBadFlagOneLine: an unknown flag or a bad value is a usage error (exit
// 2) of one line that names the flag and where the usage is; nothing else
// is printed.
func TestBadFlagOneLine(t *testing.T) {
	cases := [][]string{{"simulate", "--lbs", "x"}, {"bench", "--threads", "two"}, {"train", "--model"}, {"plan", "--lbs", "3"}}
	for name := range commands {
		cases = append(cases, []string{name, "--no-such-flag"})
	}
	for _, args := range cases {
		var out, errb bytes.Buffer
		err := run(&out, &errb, args)
		if err == nil || exitCode(err) != 2 {
			t.Errorf("%v: err %v, want a usage error (exit 2)", args, err)
			continue
		}
		msg := err.Error()
		if strings.Contains(msg, "\n") || !strings.Contains(msg, "-"+strings.TrimLeft(args[1], "-")) ||
			!strings.HasSuffix(msg, "run 'moescope "+args[0]+" --help' for usage") {
			t.Errorf("%v: error %q: want one line naming %s and the help command", args, msg, args[1])
		}
		if out.Len()+errb.Len() > 0 {
			t.Errorf("%v: printed %q and %q besides the error", args, out.String(), errb.String())
		}
	}
}

// TestExamplesRun runs every example of every command's usage as shown,
// in a fresh directory holding the repository files they name. validate's
// and bench's take seconds; -short runs the others. Under the race
// detector validate's example, which simulates every published run, is
// left to TestValidateEmbedded, which runs the same command.
func TestExamplesRun(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Chdir(dir)
	for _, name := range slices.Sorted(maps.Keys(helps)) {
		for _, e := range helps[name].examples {
			args := strings.Fields(e)[1:]
			if testing.Short() && (e == "moescope validate" || name == "bench") || raceEnabled && e == "moescope validate" {
				continue
			}
			for _, a := range args {
				copyRepoFile(t, root, a, dir)
			}
			var out, errb bytes.Buffer
			if err := run(&out, &errb, args); err != nil {
				t.Errorf("%s: %v\n%s", e, err, errb.String())
			}
		}
	}
}

// copyRepoFile copies the repository's file at the relative path rel, if
// there is one, to the same path under dir.
func copyRepoFile(t *testing.T, root, rel, dir string) {
	t.Helper()
	if !strings.Contains(rel, "/") || filepath.IsAbs(rel) {
		return
	}
	data, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return
	}
	dst := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
}
