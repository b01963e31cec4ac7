package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
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
		for _, e := range docsFlagErrors(filepath.Base(f), string(b), flags, named, strings.Contains(f, "docs/")) {
			t.Error(e)
		}
	}
	for cmd := range flags {
		if !named[cmd] {
			t.Errorf("command %s is named on no page of docs/", cmd)
		}
	}
}

// docsFlagErrors checks the command lines of text (file names it in the
// errors) against flags, each command's flags, and marks in named the
// commands it names when inDocs.
func docsFlagErrors(file, text string, flags map[string]map[string]bool, named map[string]bool, inDocs bool) []string {
	var errs []string
	for _, m := range docsCommand.FindAllStringSubmatch(text, -1) {
		cmd, rest := m[1], m[2]
		fs, ok := flags[cmd]
		if !ok {
			continue // prose: "moescope plans", "moescope models" as a noun
		}
		named[cmd] = named[cmd] || inDocs
		for _, fm := range docsFlag.FindAllStringSubmatch(rest, -1) {
			if !fs[fm[1]] && !flagOfAnother(flags, rest, fm[1]) {
				errs = append(errs, fmt.Sprintf("%s: moescope %s … --%s: %s has no such flag", file, cmd, fm[1], cmd))
			}
		}
	}
	return errs
}

// TestDocsFlagCheckCatchesPlanted: the checker refuses a planted flag a
// command does not take, and a flag of the command a line goes on to name
// passes.
func TestDocsFlagCheckCatchesPlanted(t *testing.T) {
	flags := map[string]map[string]bool{"plan": {"gpus": true}, "calibrate": {"out": true}}
	for _, c := range []struct {
		text string
		bad  int
	}{
		{"`moescope plan --gpus 8`", 0},
		{"`moescope plan --gpus 8 --no-such-flag`", 1},
		{"moescope plan --gpus 8, then moescope calibrate --out c.json", 0},
		{"`moescope plan --out c.json`", 1},
	} {
		if errs := docsFlagErrors("planted.md", c.text, flags, map[string]bool{}, true); len(errs) != c.bad {
			t.Errorf("%q: %d error(s) %q, want %d", c.text, len(errs), errs, c.bad)
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

// JSON keys in README and docs/ are written as the word JSON (or "JSON
// key", "JSON keys", "`--json`:") followed by backticked keys, one or a
// list joined by commas, "and" or "or", with parenthesised lists inside it:
// JSON `fits`, JSON keys `pp`, `pp_schedule` and `cp`, `--json`:
// `stages[]` (`gpus`, `grew`), `best`. A key may be a path (`cpu.usable_cpus`, `[]`
// after a list: `stages[].grew`) and may be followed, inside its
// backticks, by ": " and a value (`tps_interval: [low, high]`).
// docs/conventions.md states the convention.
var (
	docsJSONMarker = regexp.MustCompile("(?:\\bJSON(?: keys?)?|`--json`:)\\s+")
	docsJSONSpan   = regexp.MustCompile("^`([^`\\n]+)`")
	docsJSONSep    = regexp.MustCompile(`^\s*\)?\s*(?:,\s*)?\(?\s*(?:(?:and|or)\s+)?`)
	docsJSONPath   = regexp.MustCompile(`^([a-z][a-z0-9_]*)(?:\[\])?((?:\.[a-z][a-z0-9_]*(?:\[\])?)*)(?:: .*)?$`)
)

// docsJSONKeyErrors checks every JSON key text names (by the convention
// above) against keys, the JSON keys moescope writes or reads; file
// names text in the errors.
func docsJSONKeyErrors(file, text string, keys map[string]bool) []string {
	var errs []string
	for _, loc := range docsJSONMarker.FindAllStringIndex(text, -1) {
		rest := text[loc[1]:]
		for {
			m := docsJSONSpan.FindStringSubmatch(rest)
			if m == nil {
				break
			}
			line := 1 + strings.Count(text[:len(text)-len(rest)], "\n")
			if p := docsJSONPath.FindStringSubmatch(m[1]); p == nil {
				errs = append(errs, fmt.Sprintf("%s:%d: JSON `%s`: not a key (lower-case words joined by _ and .)", file, line, m[1]))
			} else {
				for _, k := range strings.Split(strings.ReplaceAll(p[1]+p[2], "[]", ""), ".") {
					if !keys[k] {
						errs = append(errs, fmt.Sprintf("%s:%d: JSON `%s`: no JSON moescope writes or reads has the key %q", file, line, m[1], k))
					}
				}
			}
			rest = rest[len(m[0]):]
			sep := docsJSONSep.FindString(rest)
			if !strings.HasPrefix(rest[len(sep):], "`") {
				break
			}
			rest = rest[len(sep):]
		}
	}
	return errs
}

// moduleJSONKeys is every key of the JSON moescope writes or reads: the
// json tags of the struct fields in the module's non-test Go files.
func moduleJSONKeys(t *testing.T) map[string]bool {
	t.Helper()
	root := filepath.Join("..", "..")
	keys := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if fld, ok := n.(*ast.Field); ok && fld.Tag != nil {
				tag, _ := strconv.Unquote(fld.Tag.Value)
				if k, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ","); k != "" && k != "-" {
					keys[k] = true
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestDocsNameRealJSONKeys: every JSON key README and docs/ name (by the
// convention above) is a key of the JSON moescope writes or reads.
func TestDocsNameRealJSONKeys(t *testing.T) {
	keys := moduleJSONKeys(t)
	files, _ := filepath.Glob("../../docs/*.md")
	files = append(files, "../../README.md")
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range docsJSONKeyErrors(filepath.Base(f), string(b), keys) {
			t.Error(e)
		}
		checked += len(docsJSONMarker.FindAllStringIndex(string(b), -1))
	}
	if checked < 10 {
		t.Errorf("only %d JSON key lists found in README and docs/: the convention is not being followed or the pattern is wrong", checked)
	}
}

// TestDocsJSONKeyCheckCatchesPlanted: the checker refuses a planted key
// no JSON has, in each form of the convention, and passes real ones.
func TestDocsJSONKeyCheckCatchesPlanted(t *testing.T) {
	keys := map[string]bool{"fits": true, "cpu": true, "usable_cpus": true, "stages": true, "grew": true, "tps_interval": true}
	for _, c := range []struct {
		text string
		bad  int
	}{
		{"JSON `fits` is true when …", 0},
		{"JSON `no_such_key` is …", 1},
		{"JSON keys `fits`, `cpu.usable_cpus` and `no_such_key`.", 1},
		{"`--json`: `fits`,\n  `stages[].grew`, `planted_key` or `tps_interval: [low, high]`", 1},
		{"JSON `cpu.no_such_key`", 1},
		{"JSON `stages[]` (`grew`, `no_such_key`), `fits`", 1},
		{"JSON `fits` (the list ends at words: `not_checked`)", 0},
		{"JSON `--flag`", 1},
	} {
		if errs := docsJSONKeyErrors("planted.md", c.text, keys); len(errs) != c.bad {
			t.Errorf("%q: %d error(s) %q, want %d", c.text, len(errs), errs, c.bad)
		}
	}
}
