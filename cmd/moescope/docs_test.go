package main

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// commandFlags lists every command's flags from its own usage (`moescope
// CMD --help`: the flag package's "-name" lines).
func commandFlags(t *testing.T) map[string]map[string]bool {
	t.Helper()
	flagLine := regexp.MustCompile(`(?m)^\s+-([a-z0-9][a-z0-9-]*)`)
	out := map[string]map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(commands)) {
		var o, e bytes.Buffer
		_ = run(&o, &e, []string{name, "--help"})
		out[name] = map[string]bool{"help": true, "h": true}
		for _, m := range flagLine.FindAllStringSubmatch(o.String()+e.String(), -1) {
			out[name][m[1]] = true
		}
	}
	return out
}

// docsFlagRef matches "moescope CMD" followed, on the same line, by its
// flags ("--name"): how the README and docs/ write a command line.
var (
	docsCommand = regexp.MustCompile("moescope ([a-z]+)((?:[^\\n`]*))")
	docsFlag    = regexp.MustCompile(`--([a-z][a-z0-9-]+)`)
)

// TestDocsNameRealCommandsAndFlags: every `moescope CMD … --flag` the README
// and the pages of docs/ write names a command that exists and flags that
// command takes, and every command has a page in docs/ that names it.
func TestDocsNameRealCommandsAndFlags(t *testing.T) {
	flags := commandFlags(t)
	files, _ := filepath.Glob("../../docs/*.md")
	files = append(files, "../../README.md")
	named := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range docsCommand.FindAllStringSubmatch(string(b), -1) {
			cmd, rest := m[1], m[2]
			fs, ok := flags[cmd]
			if !ok {
				continue // prose: "moescope plans", "moescope models" as a noun
			}
			named[cmd] = named[cmd] || strings.Contains(f, "docs/")
			for _, fm := range docsFlag.FindAllStringSubmatch(rest, -1) {
				if !fs[fm[1]] && !flagOfAnother(flags, rest, fm[1]) {
					t.Errorf("%s: moescope %s … --%s: %s has no such flag", filepath.Base(f), cmd, fm[1], cmd)
				}
			}
		}
	}
	for cmd := range flags {
		if !named[cmd] {
			t.Errorf("command %s is named on no page of docs/", cmd)
		}
	}
}

// flagOfAnother reports whether a line that goes on to name another
// command ("… then moescope calibrate --out …") gives flag to that one.
func flagOfAnother(flags map[string]map[string]bool, rest, flag string) bool {
	for _, m := range docsCommand.FindAllStringSubmatch(rest, -1) {
		if fs, ok := flags[m[1]]; ok && fs[flag] {
			return true
		}
	}
	return false
}
