package main

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// helpFlags returns the flags `moescope CMD -h` lists, and the usage line
// of each.
func helpFlags(t *testing.T, cmd string) map[string]string {
	t.Helper()
	var out, errb bytes.Buffer
	if err := run(&out, &errb, []string{cmd, "-h"}); err != nil {
		t.Fatalf("%s -h: %v", cmd, err)
	}
	names := map[string]string{}
	lines := strings.Split(out.String(), "\n")
	re := regexp.MustCompile(`^  -([a-z0-9-]+)`)
	for i, l := range lines {
		if m := re.FindStringSubmatch(l); m != nil && i+1 < len(lines) {
			names[m[1]] = lines[i+1]
		}
	}
	if len(names) == 0 {
		t.Fatalf("%s -h listed no flags on stdout:\n%s", cmd, out.String())
	}
	return names
}

// TestRunFlagsEverywhere: every run-description flag of simulate (its flags
// less those of output and hardware, written out here by hand) is a flag of
// plan, sweep and memory, accepted or refused by name with a reason (never
// flag's "not defined").
func TestRunFlagsEverywhere(t *testing.T) {
	notRun := []string{"model", "gpu", "cluster", "calibration", "trace", "trace-ranks", "force", "json", "memory-target"}
	sim := helpFlags(t, "simulate")
	var runFlags []string
	for n := range sim {
		if !slices.Contains(notRun, n) {
			runFlags = append(runFlags, n)
		}
	}
	slices.Sort(runFlags)
	// DESIGN's "Precision and compile" and "The stack" flags that exist
	// today, and the batch: the list above must hold them.
	for _, n := range []string{"precision", "compile", "expandable-segments", "grad-dtype", "reduce-dtype", "optimizer-dtype",
		"loss-dtype", "param-dtype", "dispatcher", "expert-gemm", "fused-elementwise", "torch-version", "expert-skew", "routing",
		"lbs", "seq", "grad-accum", "ac", "ep", "pp", "tp", "fsdp-impl"} {
		if !slices.Contains(runFlags, n) {
			t.Errorf("simulate lacks --%s", n)
		}
	}
	for _, cmd := range []string{"plan", "sweep", "memory"} {
		got := helpFlags(t, cmd)
		for _, n := range runFlags {
			usage, ok := got[n]
			switch {
			case !ok:
				t.Errorf("%s lacks --%s (simulate takes it)", cmd, n)
			case strings.Contains(usage, "refused") && len(strings.TrimSpace(usage)) < len("not used here (refused): ")+10:
				t.Errorf("%s refuses --%s without a reason: %q", cmd, n, usage)
			}
		}
	}
}

// TestPlanTakesRecipe: recipe flags change plan's answer as they change
// simulate's, and a searched flag is refused by name.
func TestPlanTakesRecipe(t *testing.T) {
	base := []string{"plan", "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4096", "--json", "--top", "1"}
	var a, b, errb bytes.Buffer
	if err := run(&a, &errb, base); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if err := run(&b, &errb, append(slices.Clone(base), "--dispatcher", "deepep", "--expert-skew", "1.3")); err != nil {
		t.Fatalf("--dispatcher deepep --expert-skew 1.3: %v\n%s", err, errb.String())
	}
	if a.String() == b.String() {
		t.Error("plan's answer did not change with --dispatcher deepep --expert-skew 1.3")
	}
	err := run(&a, &errb, append(slices.Clone(base), "--ep", "8"))
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "ep") || !strings.Contains(err.Error(), "plan searches") {
		t.Errorf("plan --ep 8: %v, want a usage error saying plan searches it", err)
	}
}
