package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

var writeWalkthroughLogs = flag.Bool("walkthrough-logs", false,
	"rewrite testdata/walkthrough/*.log, the logs README's second walkthrough calibrates from")

// walkthroughDir holds the torchtitan logs that stand in for the runs of
// README's second walkthrough.
const walkthroughDir = "../../testdata/walkthrough"

// Planted in the logs of testdata/walkthrough: the GPUs of these "runs" run
// grouped GEMMs at 0.85 of the model's default speed and NVLink at 0.9 of
// the hgx cluster's efficiency; every other parameter at its default.
// Only the two parameters the sweep identifies are planted (as in
// TestSweepRecoversPlantedCalibration), so calibrate must give them back.
const walkthroughGrouped, walkthroughNVLink = 0.85, 0.9

// TestWalkthroughLogs, run with -walkthrough-logs, writes the logs README's
// second walkthrough calibrates from: the sweep's jobs for Qwen3-30B-A3B on
// 512 B200, each simulated with the multipliers above and written in
// torchtitan v0.2.2's console format. They are data, not a golden: a
// change to the cost model does not rewrite what the "GPUs" measured.
func TestWalkthroughLogs(t *testing.T) {
	if !*writeWalkthroughLogs {
		t.Skip("writes testdata/walkthrough only with -walkthrough-logs")
	}
	_, m := mainJobSweep(t)
	cl, _ := hw.LoadCluster("hgx")
	dev, _ := hw.LookupDevice("b200")
	planted := &cost.Calibration{GEMMScale: 1, GroupedScale: walkthroughGrouped, AttentionScale: 1, MemoryBoundScale: 1,
		NVLinkEfficiency: walkthroughNVLink * cl.NVLinkEfficiency, NetEfficiency: cl.NetEfficiency}
	if err := os.MkdirAll(walkthroughDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, j := range m.Jobs {
		// As the sweep's run script runs them: placeholders filled, the
		// config printed (job.print_config).
		writeSimulatedLog(t, j.TOML, filepath.Join(walkthroughDir, j.Name+".log"), dev, planted,
			map[string]string{"hf_assets_path": "./assets/hf/Qwen3-30B-A3B", "dataset": "c4"})
	}
}

// readmeCommand is one command of README's walkthroughs: a line "$ go run
// ./cmd/moescope ARGS" (or "$ moescope ARGS") inside a fenced block, and
// the lines shown after it up to the next "$ " line or the fence. A shown
// line "…" stands for any number of printed lines.
type readmeCommand struct {
	line  int // 1-based, in README.md
	args  []string
	shown []string
}

// readmeCommands reads the commands of the README's fenced blocks. A
// command line may continue over lines ending in " \"; it must be plain
// words (no quotes, pipes, redirections or variables) so that running its
// words is running what a shell would run; words with * are globs.
func readmeCommands(text string) ([]readmeCommand, error) {
	var cmds []readmeCommand
	fenced, inCmd := false, false
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimRight(lines[i], " \t\r")
		switch {
		case strings.HasPrefix(l, "```"):
			fenced, inCmd = !fenced, false
		case fenced && strings.HasPrefix(l, "$ "):
			no, words := i+1, l[2:]
			for strings.HasSuffix(words, `\`) && i+1 < len(lines) {
				i++
				words = strings.TrimSuffix(words, `\`) + " " + strings.TrimSpace(lines[i])
			}
			if strings.ContainsAny(words, "|<>;&'\"$`") {
				return nil, fmt.Errorf("README.md:%d: %q: a walkthrough command is plain words", no, words)
			}
			f := strings.Fields(words)
			switch {
			case len(f) > 3 && f[0] == "go" && f[1] == "run" && f[2] == "./cmd/moescope":
				f = f[3:]
			case len(f) > 1 && f[0] == "moescope":
				f = f[1:]
			default:
				return nil, fmt.Errorf("README.md:%d: %q is not a moescope command", no, words)
			}
			cmds, inCmd = append(cmds, readmeCommand{line: no, args: f}), true
		case fenced && inCmd:
			c := &cmds[len(cmds)-1]
			c.shown = append(c.shown, l)
		}
	}
	return cmds, nil
}

// matchShown reports whether got, the lines a command printed, are what
// shown shows: shown's lines between "…" lines appear in got in order,
// each run of them on consecutive lines, the first at got's start unless
// shown opens with "…" and the last at its end unless shown closes with
// "…". Trailing spaces are ignored on both sides.
func matchShown(shown, got []string) error {
	if len(shown) == 0 {
		return errors.New("the README shows no output (write … for output it leaves out)")
	}
	trim := func(ls []string) []string {
		out := make([]string, len(ls))
		for i, l := range ls {
			out[i] = strings.TrimRight(l, " \t")
		}
		return out
	}
	shown, got = trim(shown), trim(got)
	var runs [][]string
	cur := []string{}
	for _, l := range shown {
		if l == "…" {
			runs, cur = append(runs, cur), []string{}
			continue
		}
		cur = append(cur, l)
	}
	runs = append(runs, cur)
	pos := 0
	for k, r := range runs {
		if len(r) == 0 {
			continue
		}
		found := -1
		for i := pos; i+len(r) <= len(got); i++ {
			if k == 0 && i > 0 {
				break // the first run opens the output
			}
			if equalLines(got[i:i+len(r)], r) {
				found = i
				break
			}
		}
		if found < 0 {
			return fmt.Errorf("shown lines from %q on are not printed (in this order, after line %d)", r[0], pos)
		}
		pos = found + len(r)
	}
	if last := runs[len(runs)-1]; len(last) > 0 && pos != len(got) {
		return fmt.Errorf("printed %d more line(s) after the last shown one; end the shown output with …", len(got)-pos)
	}
	return nil
}

func equalLines(a, b []string) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestMatchShown checks the matcher on hand-made outputs.
func TestMatchShown(t *testing.T) {
	got := []string{"a", "b", "c", "d"}
	for _, c := range []struct {
		shown []string
		ok    bool
	}{
		{[]string{"a", "b", "c", "d"}, true},
		{[]string{"a", "…", "d"}, true},
		{[]string{"…", "b", "c", "…"}, true},
		{[]string{"a", "c", "…"}, false},      // not consecutive
		{[]string{"b", "…"}, false},           // does not open the output
		{[]string{"a", "b"}, false},           // output goes on
		{[]string{"…", "c", "…", "b"}, false}, // out of order
		{[]string{"a  ", "…", "d\t"}, true},   // trailing space
		{[]string{"…", "x", "…"}, false},      // not printed
		{nil, false},
	} {
		if err := matchShown(c.shown, got); (err == nil) != c.ok {
			t.Errorf("matchShown(%q): %v, want ok %v", c.shown, err, c.ok)
		}
	}
}

// TestReadmeCommands checks the reader on a hand-made README.
func TestReadmeCommands(t *testing.T) {
	text := "text\n$ moescope plan --gpus 8\n```\n$ go run ./cmd/moescope sweep \\\n  --out s\nline 1\n…\n\n$ moescope version\nv\n```\n"
	cmds, err := readmeCommands(text)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 2 || strings.Join(cmds[0].args, " ") != "sweep --out s" || cmds[0].line != 4 ||
		strings.Join(cmds[0].shown, "|") != "line 1|…|" || strings.Join(cmds[1].shown, "|") != "v" {
		t.Errorf("got %+v", cmds)
	}
	for _, bad := range []string{"```\n$ moescope plan | head\n```\n", "```\n$ ls\n```\n", "```\n$ moescope plan --out \"a b\"\n```\n"} {
		if _, err := readmeCommands(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestREADMEWalkthroughs runs every "$ " command of README.md's fenced
// blocks, in order, in one directory that holds what a fresh clone's root
// holds for them (testdata/walkthrough), and checks that each succeeds
// and prints what the README shows after it.
func TestREADMEWalkthroughs(t *testing.T) {
	if testing.Short() {
		t.Skip("plans at 512 GPUs twice, sweeps and calibrates (about 15 s)")
	}
	text, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := readmeCommands(string(text))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, c := range cmds {
		seen[c.args[0]] = true
	}
	for _, want := range []string{"plan", "sweep", "calibrate"} {
		if !seen[want] {
			t.Errorf("README's walkthroughs run no %s command", want)
		}
	}
	logs, err := filepath.Glob(filepath.Join(walkthroughDir, "*.log"))
	if err != nil || len(logs) == 0 {
		t.Fatalf("no logs in %s: %v", walkthroughDir, err)
	}
	dir := t.TempDir()
	clone := filepath.Join(dir, "testdata", "walkthrough")
	if err := os.MkdirAll(clone, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(clone, filepath.Base(l)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(dir)
	for _, c := range cmds {
		args, err := expandGlobs(c.args)
		if err != nil {
			t.Fatalf("README.md:%d: %v", c.line, err)
		}
		var out bytes.Buffer
		if err := run(&out, &out, args); err != nil {
			t.Fatalf("README.md:%d: moescope %s: %v\n%s", c.line, strings.Join(c.args, " "), err, out.String())
		}
		got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
		shown := c.shown
		for len(shown) > 0 && shown[len(shown)-1] == "" {
			shown = shown[:len(shown)-1]
		}
		if err := matchShown(shown, got); err != nil {
			t.Errorf("README.md:%d: moescope %s: %v; it printed:\n%s", c.line, strings.Join(c.args, " "), err, out.String())
		}
	}
}

// expandGlobs expands the words holding * as a shell would, in sorted
// order; a glob that matches nothing is an error (a shell would pass it
// on unexpanded).
func expandGlobs(args []string) ([]string, error) {
	var out []string
	for _, a := range args {
		if !strings.Contains(a, "*") {
			out = append(out, a)
			continue
		}
		m, err := filepath.Glob(a)
		if err != nil || len(m) == 0 {
			return nil, fmt.Errorf("%s matches no file", a)
		}
		out = append(out, m...)
	}
	return out, nil
}
