package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/internal/fileio"
)

func runSimCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(&out, &errb, args)
	return out.String() + errb.String(), err
}

func TestSimulateJSON(t *testing.T) {
	out, err := runSimCmd(t, "simulate", "--model", "tiny", "--gpus", "8", "--ep", "2", "--lbs", "2", "--seq", "128", "--grad-accum", "2", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var r map[string]any
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, k := range []string{"tps", "mfu", "hfu", "mfu_by_convention", "memory_fraction", "peak_reserved_bytes", "step_time_s", "breakdown", "bottleneck"} {
		if _, ok := r[k]; !ok {
			t.Errorf("JSON lacks %q:\n%s", k, out)
		}
	}
	if c, _ := r["mfu_by_convention"].(map[string]any); c["torchtitan"] != r["mfu"] {
		t.Errorf("mfu %v ≠ mfu_by_convention.torchtitan %v", r["mfu"], c["torchtitan"])
	}
}

func TestSimulateTextAndTrace(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "t.json")
	out, err := runSimCmd(t, "simulate", "--model", "tiny", "--gpu", "h100", "--gpus", "4", "--lbs", "1", "--seq", "64", "--trace", trace)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"hgx-h100", "TPS", "MFU (torchtitan)", "bottleneck:", "exposed", "trace of 4 rank(s)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	var doc map[string]any
	b, err := os.ReadFile(trace)
	if err != nil || json.Unmarshal(b, &doc) != nil {
		t.Fatalf("trace unreadable: %v", err)
	}
	// No overwrite without --force.
	_, err = runSimCmd(t, "simulate", "--model", "tiny", "--gpus", "4", "--lbs", "1", "--seq", "64", "--trace", trace)
	if !errors.Is(err, fileio.ErrExists) {
		t.Errorf("overwrote the trace: %v", err)
	}
	if _, err := runSimCmd(t, "simulate", "--model", "tiny", "--gpus", "4", "--lbs", "1", "--seq", "64", "--trace", trace, "--force"); err != nil {
		t.Errorf("--force: %v", err)
	}
}

func TestSimulateBadInput(t *testing.T) {
	for name, args := range map[string][]string{
		"no model":      {"--gpus", "8", "--lbs", "1", "--seq", "64"},
		"lbs 0":         {"--model", "tiny", "--gpus", "8", "--lbs", "0", "--seq", "64"},
		"bad gpu":       {"--model", "tiny", "--gpu", "z9", "--gpus", "8", "--lbs", "1", "--seq", "64"},
		"bad cluster":   {"--model", "tiny", "--cluster", "nope", "--gpus", "8", "--lbs", "1", "--seq", "64"},
		"ep ∤ experts":  {"--model", "tiny", "--gpus", "8", "--ep", "8", "--lbs", "1", "--seq", "64"},
		"bad ac":        {"--model", "tiny", "--gpus", "8", "--lbs", "1", "--seq", "64", "--ac", "some"},
		"bad skew":      {"--model", "tiny", "--gpus", "8", "--lbs", "1", "--seq", "64", "--expert-skew", "0.5"},
		"bad trace rks": {"--model", "tiny", "--gpus", "8", "--lbs", "1", "--seq", "64", "--trace", filepath.Join(t.TempDir(), "x.json"), "--trace-ranks", "9"},
	} {
		out, err := runSimCmd(t, append([]string{"simulate"}, args...)...)
		if err == nil {
			t.Errorf("%s: accepted\n%s", name, out)
		} else if exitCode(err) == 0 {
			t.Errorf("%s: exit code 0", name)
		}
	}
}

// calibrate writes a calibration that simulate applies; it refuses to
// overwrite without --force. The run is Llama 3 8B at about 80% of its
// uncalibrated prediction (28,600): the tiny test model's kernels all take
// the launch floor, where no efficiency moves its TPS.
func TestCalibrateCommand(t *testing.T) {
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs.json")
	if err := os.WriteFile(runs, []byte(`[{"model":"llama3-8b","gpu":"h100-96gb","gpus":8,"dp_shard":8,"dp_replicate":1,"ep":1,"ac":"selective","lbs":2,"seq":8192,"precision":"bf16","tps":6667}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	cal := filepath.Join(dir, "cal.json")
	out, err := runSimCmd(t, "calibrate", "--runs", runs, "--out", cal)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"fitted", "kept default", "residuals"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, err := runSimCmd(t, "calibrate", "--runs", runs, "--out", cal); !errors.Is(err, fileio.ErrExists) {
		t.Errorf("overwrote %s: %v", cal, err)
	}
	out, err = runSimCmd(t, "simulate", "--model", "llama3-8b", "--gpu", "h100-96gb", "--gpus", "8", "--lbs", "2", "--seq", "8192",
		"--calibration", cal, "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var r struct {
		TPS      float64
		Interval *[2]float64 `json:"tps_interval"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	// One run fits one overall compute scale: the same layout then
	// predicts the measured 6667 (the prior may leave a fraction of a
	// percent), inside its own 90% interval.
	if r.TPS < 6600 || r.TPS > 6734 {
		t.Errorf("calibrated TPS %.0f, fitted to 6667", r.TPS)
	}
	if r.Interval == nil || !(r.Interval[0] < r.TPS && r.TPS < r.Interval[1]) {
		t.Errorf("tps_interval %v around %.0f", r.Interval, r.TPS)
	}
	if text, err := runSimCmd(t, "simulate", "--model", "llama3-8b", "--gpu", "h100-96gb", "--gpus", "8", "--lbs", "2", "--seq", "8192",
		"--calibration", cal); err != nil || !strings.Contains(text, " ± ") {
		t.Errorf("text output lacks TPS ± x%%: %v\n%s", err, text)
	}
	if _, err := runSimCmd(t, "calibrate", "--runs", filepath.Join(dir, "missing.json"), "--out", filepath.Join(dir, "c2.json")); err == nil {
		t.Error("missing runs file accepted")
	}
}

// TestFitsVerdict: simulate and memory say whether a layout fits (DESIGN.md,
// "Fits"). Qwen3-30B-A3B at 64 sequences of 4096 tokens per H100 without
// checkpointing needs terabytes: the first line says it does not fit, the
// times still follow, the JSON carries fits false and a negative headroom,
// and the exit status is 0. The tiny model fits, and at a target of
// 10⁻⁹ it is above the target yet still fits.
func TestFitsVerdict(t *testing.T) {
	huge := []string{"--model", "qwen3-30b-a3b", "--seq", "4096", "--gpu", "h100", "--gpus", "8", "--lbs", "64", "--ac", "none"}
	for _, cmd := range []string{"simulate", "memory"} {
		out, err := runSimCmd(t, append([]string{cmd}, huge...)...)
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		if first, _, _ := strings.Cut(out, "\n"); !strings.HasPrefix(first, "does not fit: needs ") || !strings.HasSuffix(first, " GiB of 79.11 GiB") {
			t.Errorf("%s: first line %q", cmd, first)
		}
		if cmd == "simulate" && !strings.Contains(out, "step time") {
			t.Errorf("simulate: no times after the verdict:\n%s", out)
		}
		var r struct {
			Fits         *bool  `json:"fits"`
			Headroom     *int64 `json:"headroom_bytes"`
			WithinTarget *bool  `json:"within_target"`
		}
		js, err := runSimCmd(t, append([]string{cmd, "--json"}, huge...)...)
		if err != nil || json.Unmarshal([]byte(js), &r) != nil || r.Fits == nil || *r.Fits || r.Headroom == nil || *r.Headroom >= 0 || r.WithinTarget == nil || *r.WithinTarget {
			t.Errorf("%s --json: %v, fits/headroom/within_target %+v", cmd, err, r)
		}
	}
	small := []string{"--model", "tiny", "--gpus", "4", "--lbs", "1", "--seq", "64"}
	for _, cmd := range []string{"simulate", "memory"} {
		out, err := runSimCmd(t, append([]string{cmd}, small...)...)
		if err != nil || strings.HasPrefix(out, "does not fit") || strings.HasPrefix(out, "above the memory target") {
			t.Errorf("%s tiny: %v\n%s", cmd, err, out)
		}
		out, err = runSimCmd(t, append([]string{cmd, "--memory-target", "1e-9"}, small...)...)
		if err != nil || !strings.HasPrefix(out, "above the memory target: ") {
			t.Errorf("%s tiny at target 1e-9: %v\n%s", cmd, err, out)
		}
		if _, err := runSimCmd(t, append([]string{cmd, "--memory-target", "1.5"}, small...)...); exitCode(err) != 2 || !strings.Contains(err.Error(), "--memory-target") {
			t.Errorf("%s --memory-target 1.5: %v, want a usage error", cmd, err)
		}
	}
}

// TestClusterAbsurdLatencyRefused (issue 17, defect 8): a cluster file with
// base_latency_us 1e300 or nvlink_gbps 1e-300 printed a 300-digit step
// time, "+Inf%" and exit status 0 (plan ranked every layout at TPS 0, and
// --json failed to encode +Inf); one without net_latency_us was read as
// 0 µs. simulate and plan now refuse each as a usage error naming the field.
func TestClusterAbsurdLatencyRefused(t *testing.T) {
	dir := t.TempDir()
	good := `{"name":"mine","gpus_per_node":8,"nvlink_gbps":900,"nics_per_node":8,"nic_gbits":400,
		"base_latency_us":8.4,"nvlink_latency_us":3.4,"net_latency_us":14,"nvlink_efficiency":0.8,"net_efficiency":0.9}`
	for _, c := range []struct{ from, to, want string }{
		{`"base_latency_us":8.4`, `"base_latency_us":1e300`, "base_latency_us = 1e+300: must be in [0, 1e+06] µs"},
		{`"net_latency_us":14`, `"net_latency_us":1e300`, "net_latency_us = 1e+300"},
		{`"nvlink_gbps":900`, `"nvlink_gbps":1e-300`, "nvlink_gbps = 1e-300: must be in [1, 10000] GB/s"},
		{`"nic_gbits":400`, `"nic_gbits":1e-300`, "nic_gbits = 1e-300: must be in [1, 10000] Gb/s"},
		{`"net_latency_us":14,`, ``, "net_latency_us: required"},
		{`"base_latency_us":8.4,`, ``, "base_latency_us: required"},
	} {
		p := filepath.Join(dir, "c.json")
		if err := os.WriteFile(p, []byte(strings.Replace(good, c.from, c.to, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{
			{"simulate", "--model", "tiny", "--gpus", "8", "--lbs", "1", "--seq", "128", "--cluster", p},
			{"simulate", "--model", "tiny", "--gpus", "8", "--lbs", "1", "--seq", "128", "--cluster", p, "--json"},
			{"plan", "--model", "tiny", "--gpus", "8", "--seq", "128", "--cluster", p},
		} {
			out, err := runSimCmd(t, args...)
			if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "--cluster") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s with %s: exit %d, error %v, want %q\n%s", args[0], c.to, exitCode(err), err, c.want, out)
			}
		}
	}
}

// TestSimulateTorchVersion: an older PyTorch runs eager RMSNorm as a
// composite of fp32 kernels, so the same eager job is slower under
// --torch-version 2.6 than under the default, the same compiled (Inductor
// fuses the norm either way); a malformed release is a usage error naming
// the flag.
func TestSimulateTorchVersion(t *testing.T) {
	base := []string{"simulate", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--lbs", "1", "--seq", "2048", "--json"}
	step := func(args ...string) float64 {
		t.Helper()
		var r struct {
			Step float64 `json:"step_time_s"`
		}
		out, err := runSimCmd(t, append(append([]string{}, base...), args...)...)
		if err != nil || json.Unmarshal([]byte(out), &r) != nil || !(r.Step > 0) {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return r.Step
	}
	if old, cur := step("--compile=false", "--torch-version", "2.6"), step("--compile=false"); !(old > cur) {
		t.Errorf("eager step at torch 2.6 %g s, default %g s: want the composite norm slower", old, cur)
	}
	if old, cur := step("--torch-version", "2.6"), step(); old != cur {
		t.Errorf("compiled step at torch 2.6 %g s, default %g s: want equal", old, cur)
	}
	if _, err := runSimCmd(t, append(append([]string{}, base...), "--torch-version", "2.x")...); exitCode(err) != 2 || !strings.Contains(err.Error(), `--torch-version = "2.x"`) {
		t.Errorf("--torch-version 2.x: %v, want a usage error naming the flag and value", err)
	}
}

// TestSimulateFrameworkFlags: --expert-gemm cublas (TransformerEngine's
// per-expert cuBLAS GEMMs) and --dispatcher deepep (a row per destination
// rank) each shorten an expert-parallel step; a value outside the list is
// a usage error naming the flag and the value.
func TestSimulateFrameworkFlags(t *testing.T) {
	base := []string{"simulate", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--gpus", "8", "--ep", "8", "--lbs", "1", "--seq", "2048", "--json"}
	type res struct {
		Step      float64 `json:"step_time_s"`
		Breakdown struct {
			Comm map[string]float64 `json:"comm_s"`
		} `json:"breakdown"`
	}
	run := func(args ...string) res {
		t.Helper()
		var r res
		out, err := runSimCmd(t, append(append([]string{}, base...), args...)...)
		if err != nil || json.Unmarshal([]byte(out), &r) != nil || !(r.Step > 0) {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return r
	}
	def := run()
	if te := run("--expert-gemm", "cublas"); !(te.Step < def.Step) {
		t.Errorf("--expert-gemm cublas: step %g s, default %g s: want shorter", te.Step, def.Step)
	}
	if deep := run("--dispatcher", "deepep"); !(deep.Breakdown.Comm["all_to_all"] < def.Breakdown.Comm["all_to_all"]) {
		t.Errorf("--dispatcher deepep: all_to_all %g s, default %g s: want less", deep.Breakdown.Comm["all_to_all"], def.Breakdown.Comm["all_to_all"])
	}
	for _, c := range [][2]string{{"--expert-gemm", "cutlass"}, {"--dispatcher", "nccl"}} {
		_, err := runSimCmd(t, append(append([]string{}, base...), c[0], c[1])...)
		if exitCode(err) != 2 || !strings.Contains(fmt.Sprint(err), fmt.Sprintf("%s = %q", c[0], c[1])) {
			t.Errorf("%s %s: %v, want a usage error naming the flag and value", c[0], c[1], err)
		}
	}
}

// TestSimulateReduceDType: --reduce-dtype bf16 halves the gradient
// reduce-scatter's bytes (2 bytes an element instead of f32's 4), so its
// time falls; --grad-dtype and --reduce-dtype outside {f32, bf16} are
// usage errors naming the flag and the value.
func TestSimulateReduceDType(t *testing.T) {
	base := []string{"simulate", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--gpus", "16", "--lbs", "1", "--seq", "2048", "--json"}
	rs := func(args ...string) float64 {
		t.Helper()
		var r struct {
			Breakdown struct {
				Comm map[string]float64 `json:"comm_s"`
			} `json:"breakdown"`
		}
		out, err := runSimCmd(t, append(append([]string{}, base...), args...)...)
		if err != nil || json.Unmarshal([]byte(out), &r) != nil || !(r.Breakdown.Comm["reduce_scatter"] > 0) {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return r.Breakdown.Comm["reduce_scatter"]
	}
	if f32, bf16 := rs(), rs("--reduce-dtype", "bf16"); !(bf16 < 0.75*f32) {
		t.Errorf("reduce_scatter %g s with --reduce-dtype bf16, %g s with f32: want about half", bf16, f32)
	}
	for _, c := range [][2]string{{"--reduce-dtype", "f8"}, {"--grad-dtype", "fp16"}} {
		_, err := runSimCmd(t, append(append([]string{}, base...), c[0], c[1])...)
		if exitCode(err) != 2 || !strings.Contains(fmt.Sprint(err), fmt.Sprintf("%s = %q", c[0], c[1])) {
			t.Errorf("%s %s: %v, want a usage error naming the flag and value", c[0], c[1], err)
		}
	}
}
