package main

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/moescope/moescope/bench"
	"github.com/moescope/moescope/moe/kernel"
)

func TestBenchJSON(t *testing.T) {
	var out, errb bytes.Buffer
	err := run(&out, &errb, []string{"bench", "--json", "--model", "tiny", "--tokens", "40", "--threads", "2",
		"--sizes", "24", "--experts", "0", "--top-k", "0", "--iters", "1"})
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, errb.String())
	}
	var r struct {
		Peak        float64 `json:"peak_gflops"`
		PeakPerCore float64 `json:"peak_gflops_per_core"`
		GEMM        []struct {
			M, N, K, Threads int
			GFLOPS           float64 `json:"gflops"`
			PeakFraction     float64 `json:"peak_fraction"`
			MedianGFLOPS     float64 `json:"median_gflops"`
		} `json:"gemm"`
		Layer struct {
			TokensPerS   float64 `json:"tokens_per_s"`
			GFLOPS       float64 `json:"gflops"`
			PeakFraction float64 `json:"peak_fraction"`
			Seq          int     `json:"seq"`
			ModelFLOPs   int64   `json:"model_flops"`
		} `json:"layer"`
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out.String())
	}
	if r.Peak <= 0 || r.PeakPerCore <= 0 {
		t.Errorf("peaks %v, %v", r.Peak, r.PeakPerCore)
	}
	// One square at 1 and 2 threads, six expert shapes at 1 and 2 threads.
	if len(r.GEMM) != 14 {
		t.Errorf("%d GEMM rows, want 14", len(r.GEMM))
	}
	for _, g := range r.GEMM {
		if g.GFLOPS <= 0 || g.PeakFraction <= 0 || g.M <= 0 || (g.Threads != 1 && g.Threads != 2) {
			t.Errorf("implausible GEMM row %+v", g)
		}
		// The median call takes at least as long as the best one.
		if g.MedianGFLOPS <= 0 || g.MedianGFLOPS > g.GFLOPS {
			t.Errorf("median %v GFLOP/s against best %v: want 0 < median ≤ best", g.MedianGFLOPS, g.GFLOPS)
		}
	}
	if r.Layer.Seq != 40 || r.Layer.TokensPerS <= 0 || r.Layer.GFLOPS <= 0 || r.Layer.ModelFLOPs <= 0 {
		t.Errorf("implausible layer %+v", r.Layer)
	}
}

func TestBenchFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--threads", "0"}, "--threads 0"},
		{[]string{"bench", "--tokens", "-1"}, "--tokens -1"},
		{[]string{"bench", "--sizes", "12,x"}, `--sizes: "x"`},
		{[]string{"bench", "--model", "tiny", "--experts", "2", "--top-k", "3"}, "--top-k 3 exceeds the 2 experts"},
		{[]string{"bench", "--model", "tiny-dense"}, "no MoE layer"},
	} {
		var out, errb bytes.Buffer
		err := run(&out, &errb, c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one containing %q", c.args, err, c.want)
		}
	}
}

// TestBenchNamesUsableCPUs: bench's cpu line gives the CPUs this process
// may use (runtime.NumCPU, its affinity mask), and cpuid's core count only
// labelled as cpuid's (a VM may report its host's).
func TestBenchNamesUsableCPUs(t *testing.T) {
	if got := kernel.Info().UsableCPUs; got != runtime.NumCPU() {
		t.Errorf("UsableCPUs %d, runtime.NumCPU %d", got, runtime.NumCPU())
	}
	var b strings.Builder
	printBench(&b, &bench.Report{CPU: kernel.CPU{Brand: "Virtual CPU", UsableCPUs: 2, PhysicalCores: 254}})
	line, _, _ := strings.Cut(b.String(), "\n")
	if !strings.Contains(line, "2 CPUs usable by this process") || !strings.Contains(line, "(cpuid: 254 physical cores)") {
		t.Errorf("cpu line %q", line)
	}
}
