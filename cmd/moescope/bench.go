package main

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"

	"github.com/moescope/moescope/bench"
	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/kernel"
)

func init() {
	register(command{"bench", "measured CPU peak, GEMM and MoE-layer speed of the reference kernels (optionally beside PyTorch)", runBench})
}

func runBench(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("bench", stderr)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	model := fs.String("model", "qwen3-30b-a3b", "built-in model name or config.json path whose layer and expert shapes are measured")
	tokens := fs.Int("tokens", 2048, "tokens of the layer benchmark (one sequence)")
	threads := fs.Int("threads", runtime.NumCPU(), "threads the kernels use (default: the CPUs this process may use)")
	experts := fs.Int("experts", 16, "routed experts in the benchmarked layer (0 = the model's own)")
	topK := fs.Int("top-k", 4, "experts per token in the benchmarked layer (0 = the model's own)")
	iters := fs.Int("iters", 3, "timed forward+backward runs of the layer (the best is reported)")
	sizes := fs.String("sizes", "256,512,1024,2048", "comma-separated sizes of the square GEMMs")
	skipGEMM := fs.Bool("no-gemm", false, "skip the GEMM table")
	skipLayer := fs.Bool("no-layer", false, "skip the layer benchmark")
	torch := fs.String("torch", "", "also run this PyTorch script (testdata/torchref/bench_layer.py) on the same layer and print the ratio")
	python := fs.String("python", "/usr/bin/python3", "Python interpreter for --torch")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the layer benchmark to this file (go tool pprof)")
	force := fs.Bool("force", false, "overwrite an existing --cpuprofile file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *threads < 1 || *threads > 4096:
		return fmt.Errorf("%w: --threads %d: want 1..4096", errUsage, *threads)
	case *tokens < 1 || *tokens > 1<<20:
		return fmt.Errorf("%w: --tokens %d: want 1..1048576", errUsage, *tokens)
	case *experts < 0 || *experts > 4096:
		return fmt.Errorf("%w: --experts %d: want 0 (the model's) or 1..4096", errUsage, *experts)
	case *topK < 0:
		return fmt.Errorf("%w: --top-k %d: want 0 (the model's) or 1..experts", errUsage, *topK)
	case *iters < 1 || *iters > 1000:
		return fmt.Errorf("%w: --iters %d: want 1..1000", errUsage, *iters)
	}
	if setFlags(fs)["python"] && *torch == "" {
		return fmt.Errorf("%w: --python = %s: used only with --torch (the interpreter of the PyTorch script); give --torch or leave --python out", errUsage, *python)
	}
	if *cpuProfile != "" && *skipLayer {
		return fmt.Errorf("%w: --cpuprofile profiles the layer benchmark, which --no-layer skips", errUsage)
	}
	if err := checkIO(*force, []input{{Flag: "--model", Path: *model}}, output{Flag: "--cpuprofile", Path: *cpuProfile}); err != nil {
		return err
	}
	squares, err := parseSizes(*sizes)
	if err != nil {
		return err
	}
	cfg, err := hf.Load(*model)
	if err != nil {
		return err
	}
	e, k := cfg.Experts, cfg.TopK
	if *experts > 0 {
		e = *experts
	}
	if *topK > 0 {
		k = *topK
	}
	if cfg.IsMoE() && k > e {
		return fmt.Errorf("%w: --top-k %d exceeds the %d experts", errUsage, k, e)
	}
	lc, err := bench.LayerConfig(cfg, *experts, *topK)
	if err != nil {
		return err
	}
	if !*skipLayer {
		if err := bench.CheckMemory(lc, *tokens, kernel.AvailableMemory()); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
	}
	o := bench.Options{Model: *model, Tokens: *tokens, Threads: *threads, Iters: *iters, Squares: squares,
		GEMMs: !*skipGEMM, Layer: !*skipLayer, Torch: *torch, Python: *python}
	// The profile is collected in memory and written atomically (DESIGN.md, "Files").
	var prof bytes.Buffer
	if *cpuProfile != "" {
		o.Profile = &prof
	}
	rep, err := bench.Run(lc, o)
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		if err := fileio.WriteFileAtomic(*cpuProfile, *force, func(w io.Writer) error {
			_, err := prof.WriteTo(w)
			return err
		}); err != nil {
			return err
		}
	}
	if *asJSON {
		return writeJSON(stdout, "bench", rep)
	}
	printBench(stdout, rep)
	return nil
}

// parseSizes reads --sizes: positive sizes up to 16384, comma-separated.
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 16384 {
			return nil, fmt.Errorf("%w: --sizes: %q is not a size in 1..16384", errUsage, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func printBench(w io.Writer, r *bench.Report) {
	c := r.CPU
	fmt.Fprintf(w, "cpu: %s (%s family %d model %d), %d CPUs usable by this process (cpuid: %d physical cores), %s; L1d %d KiB, L2 %d KiB, L3 %d KiB; kernel %s, tuning %s\n",
		c.Brand, c.Vendor, c.Family, c.Model, c.UsableCPUs, c.PhysicalCores, strings.Join(c.Features, " "),
		c.L1DBytes>>10, c.L2Bytes>>10, c.L3Bytes>>10, c.Kernel, c.Tuning)
	p := r.Peak
	fmt.Fprintf(w, "peak (float32 FMA loop, measured, best of 20 runs): clock %.2f GHz, %.1f FLOP/cycle, %.1f GFLOP/s per core, %.1f GFLOP/s on %d threads\n",
		p.ClockGHz, p.FLOPPerCycle, p.PerCoreGFLOPS, p.AllCoreGFLOPS, p.Threads)
	if len(r.GEMM) > 0 {
		fmt.Fprintf(w, "\n%-24s %-6s %6s %6s %6s %7s %9s %6s %8s %7s %11s %9s\n", "gemm", "layout", "m", "n", "k", "threads", "GFLOP/s", "%peak", "median", "%peak", "GFLOP/s cpu", "%peak cpu")
		for _, g := range r.GEMM {
			fmt.Fprintf(w, "%-24s %-6s %6d %6d %6d %7d %9.1f %5.1f%% %8.1f %6.1f%% %11.1f %8.1f%%\n", g.Op, g.Layout, g.M, g.N, g.K, g.Threads,
				g.GFLOPS, 100*g.PeakFraction, g.MedianGFLOPS, 100*g.MedianPeakFraction, g.CPUGFLOPS, 100*g.CPUPeakFraction)
		}
		fmt.Fprintln(w, "(GFLOP/s: best wall time of a call; median: the median call's; cpu: the same work over process CPU time ÷ threads, what the cores delivered while this process held them)")
	}
	if l := r.Layer; l != nil {
		fmt.Fprintf(w, "\nlayer %s (%d experts, top-%d), one sequence of %d tokens, %d threads, forward+backward (best of runs):\n",
			l.Model, l.Experts, l.TopK, l.Seq, l.Threads)
		fmt.Fprintf(w, "  %.3f s (forward %.3f s), %.0f tokens/s, %.1f GFLOP model FLOPs, %.1f GFLOP/s, %.1f%% of peak; cpu time %.3f s: %.1f GFLOP/s, %.1f%%\n",
			l.Seconds, l.Forward, l.TokensPerS, float64(l.ModelFLOPs)/1e9, l.GFLOPS, 100*l.PeakFraction, l.CPUSeconds, l.CPUGFLOPS, 100*l.CPUPeakFraction)
		fmt.Fprintf(w, "  set-up (weights, gradients and inputs allocated and filled) %.3f s\n", l.SetupSeconds)
	}
	if t := r.Torch; t != nil {
		fmt.Fprintf(w, "pytorch %s, %d threads, same layer (HF eager attention, per-expert loop): %.3f s, %.0f tokens/s\n",
			t.Version, t.Threads, t.Seconds, t.TokensPerS)
		if t.Ratio > 0 {
			fmt.Fprintf(w, "moescope / pytorch tokens/s: %.2f×\n", t.Ratio)
		}
	}
}
