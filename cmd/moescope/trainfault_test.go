package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// trainBounded runs train in-process and fails the test, instead of
// hanging it, when train has not returned by a deadline far above what the
// run needs.
func trainBounded(t *testing.T, args ...string) (stdout string, err error) {
	t.Helper()
	args = append([]string{"train", "--model", "tiny", "--seq", "8", "--lbs", "1", "--peak-gflops", "100"}, args...)
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		var out, errb bytes.Buffer
		err := run(&out, &errb, args)
		done <- result{out.String(), err}
	}()
	select {
	case r := <-done:
		return r.out, r.err
	case <-time.After(5 * time.Minute):
		t.Fatalf("%v has not returned after 5 minutes: hung", args)
		return "", nil
	}
}

// TestTrainFailRankCancelsEveryRank: --fail-rank 2 --fail-step 2 lets step
// 1 finish, then rank 2 fails at the start of step 2 while the other three
// wait for it in collectives: train exits non-zero naming the step, the
// rank and the fault, and every one of the 4 ranks stopped with it.
func TestTrainFailRankCancelsEveryRank(t *testing.T) {
	out, err := trainBounded(t, "--gpus", "4", "--steps", "3", "--fail-rank", "2", "--fail-step", "2")
	if err == nil || exitCode(err) != 1 {
		t.Fatalf("train with a failing rank: err %v, want exit 1", err)
	}
	for _, want := range []string{"step 2: rank 2: step 2, micro-step 0: injected fault", "all 4 ranks stopped with it", "--fail-rank"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if !strings.Contains(out, "step 1 ") || strings.Contains(out, "step 2 ") {
		t.Errorf("want step 1 and no step 2 printed:\n%s", out)
	}
}

// TestTrainStallRankWatchdog: a rank that stops making progress inside
// its compute is found by the watchdog within the collective timeout (it
// speaks after half of it), with peers waiting for the stalled rank (4
// ranks) and with none (1 rank, where no collective could time out), and
// every rank stops.
func TestTrainStallRankWatchdog(t *testing.T) {
	for _, c := range []struct {
		gpus, rank string
		stopped    string
	}{{"4", "1", "all 4 ranks stopped"}, {"1", "0", "all 1 ranks stopped"}} {
		start := time.Now()
		_, err := trainBounded(t, "--gpus", c.gpus, "--steps", "2", "--stall-rank", c.rank, "--fail-step", "2", "--collective-timeout", "2s")
		if err == nil || exitCode(err) != 1 {
			t.Fatalf("%s ranks, rank %s stalled: err %v, want exit 1", c.gpus, c.rank, err)
		}
		for _, want := range []string{"step 2: ", "watchdog: rank " + c.rank + " stalled", "half the collective timeout 2s", c.stopped} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s ranks: error %q lacks %q", c.gpus, err, want)
			}
		}
		if strings.Contains(err.Error(), "timeout: ") {
			t.Errorf("%s ranks: a collective timed out before the watchdog spoke: %v", c.gpus, err)
		}
		// Not a speed bound: the stall alone must last half the timeout.
		if d := time.Since(start); d < time.Second {
			t.Errorf("%s ranks: stopped after %v, before the stall could be 1s old", c.gpus, d)
		}
	}
}

// TestTrainFaultKeepsLastGoodCheckpoint: a run resumed from checkpoint A
// that would replace checkpoint B (--force) fails at its second step (the
// job's third):
// neither A nor B changes by a byte, no partial directory is left beside
// them, and both still resume.
func TestTrainFaultKeepsLastGoodCheckpoint(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, ck := range []string{a, b} {
		if _, err := trainBounded(t, "--gpus", "2", "--steps", "1", "--checkpoint", ck); err != nil {
			t.Fatal(err)
		}
	}
	before := map[string]map[string][]byte{a: readTree(t, a), b: readTree(t, b)}
	for _, fault := range [][]string{{"--fail-rank", "1"}, {"--stall-rank", "0", "--collective-timeout", "1s"}} {
		args := append([]string{"--gpus", "2", "--steps", "2", "--fail-step", "2", "--resume", a, "--checkpoint", b, "--force"}, fault...)
		_, err := trainBounded(t, args...)
		if err == nil || !strings.Contains(err.Error(), "nothing of this run was saved: --checkpoint "+b+" keeps what it held") {
			t.Fatalf("%v: err %v", fault, err)
		}
		// --fail-step counts this run's steps: resumed after A's one step,
		// its second is the job's third.
		if fault[0] == "--fail-rank" && !strings.Contains(err.Error(), "step 3: rank 1") {
			t.Errorf("%v: err %v, want the fault at the job's step 3", fault, err)
		}
		for ck, files := range before {
			if got := readTree(t, ck); !sameTree(got, files) {
				t.Errorf("%v: checkpoint %s changed", fault, ck)
			}
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 2 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("%v: %s holds %v, want only a and b", fault, dir, names)
		}
	}
	for _, ck := range []string{a, b} {
		if _, err := trainBounded(t, "--gpus", "1", "--grad-accum", "2", "--steps", "1", "--resume", ck); err != nil {
			t.Errorf("resume %s after the failed run: %v", ck, err)
		}
	}
}

func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		files[p] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func sameTree(x, y map[string][]byte) bool {
	if len(x) != len(y) {
		return false
	}
	for p, b := range x {
		if !bytes.Equal(b, y[p]) {
			return false
		}
	}
	return true
}

// TestTrainFaultFlagsRefused: each fault flag outside its range is a usage
// error naming the flag, the value and the range, before any step runs.
func TestTrainFaultFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--fail-rank", "4"}, "--fail-rank = 4: must be a rank in [0, 3]"},
		{[]string{"--fail-rank", "-2"}, "--fail-rank = -2: must be a rank in [0, 3]"},
		{[]string{"--stall-rank", "9"}, "--stall-rank = 9: must be a rank in [0, 3]"},
		{[]string{"--fail-rank", "0", "--stall-rank", "1"}, "at most one of --fail-rank (0) and --stall-rank (1)"},
		{[]string{"--fail-step", "2"}, "--fail-step = 2 needs --fail-rank or --stall-rank"},
		{[]string{"--fail-rank", "1", "--fail-step", "3"}, "--fail-step = 3: must be in [1, 2] (--steps)"},
		{[]string{"--fail-rank", "1", "--fail-step", "-1"}, "--fail-step = -1: must be in [1, 2]"},
		{[]string{"--collective-timeout", "0s"}, "--collective-timeout = 0s: must be in [10ms, 24h0m0s]"},
		{[]string{"--collective-timeout", "-1s"}, "--collective-timeout = -1s: must be in [10ms, 24h0m0s]"},
		{[]string{"--collective-timeout", "25h"}, "--collective-timeout = 25h0m0s: must be in [10ms, 24h0m0s]"},
	} {
		out, err := trainBounded(t, append([]string{"--gpus", "4", "--steps", "2"}, c.args...)...)
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want a usage error containing %q", c.args, err, c.want)
		}
		if strings.Contains(out, "step 1 ") {
			t.Errorf("%v: trained before refusing", c.args)
		}
	}
	var out, errb bytes.Buffer
	if err := run(&out, &errb, []string{"train", "-h"}); err != nil {
		t.Fatalf("train -h: %v", err)
	}
	for _, flag := range []string{"-fail-rank", "-stall-rank", "-fail-step", "-collective-timeout"} {
		i := strings.Index(out.String(), "  "+flag+" ")
		if i < 0 || !strings.Contains(out.String()[i:], "testing aid") {
			t.Errorf("train -h does not document %s as a testing aid", flag)
		}
	}
}
