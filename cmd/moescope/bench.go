package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/kernel"
)

func init() {
	register(command{"bench", "measured CPU peak, GEMM and MoE-layer speed of the reference kernels (optionally beside PyTorch)", runBench})
}

// benchReport is `moescope bench --json`.
type benchReport struct {
	CPU         kernel.CPU  `json:"cpu"`
	Peak        kernel.Peak `json:"peak"`
	PeakGFLOPS  float64     `json:"peak_gflops"`          // all-core FMA peak on Threads cores
	PeakPerCore float64     `json:"peak_gflops_per_core"` // one core
	Threads     int         `json:"threads"`
	GEMM        []gemmBench `json:"gemm"`
	Layer       *layerBench `json:"layer,omitempty"`
	Torch       *torchBench `json:"torch,omitempty"`
}

type gemmBench struct {
	Op           string  `json:"op"`     // what the shape is: "square" or the expert GEMM it stands for
	Layout       string  `json:"layout"` // NN, NT (A·Bᵀ) or TN (Aᵀ·B)
	M            int     `json:"m"`
	N            int     `json:"n"`
	K            int     `json:"k"`
	Threads      int     `json:"threads"`
	Seconds      float64 `json:"seconds"` // best wall time of repeated calls
	GFLOPS       float64 `json:"gflops"`  // 2·m·n·k / seconds / 1e9
	PeakFraction float64 `json:"peak_fraction"`
	cpuRates
}

// cpuRates is the same work over the process's CPU time divided by the
// threads (best of the runs): on a machine shared with other processes, the
// speed the cores delivered while this process held them. It hides load
// imbalance (a waiting thread uses no CPU), so it bounds the wall-time
// figure from above; equal when the cores are free and the work balanced.
// Absent where the OS does not report process CPU time.
type cpuRates struct {
	CPUSeconds      float64 `json:"cpu_seconds,omitempty"` // process CPU time of the best run
	CPUGFLOPS       float64 `json:"gflops_cpu,omitempty"`
	CPUPeakFraction float64 `json:"peak_fraction_cpu,omitempty"`
}

func newCPURates(flop float64, cpu time.Duration, threads int, peak float64) cpuRates {
	if cpu <= 0 {
		return cpuRates{}
	}
	gf := flop * float64(threads) / cpu.Seconds() / 1e9
	return cpuRates{CPUSeconds: cpu.Seconds(), CPUGFLOPS: gf, CPUPeakFraction: gf / peak}
}

type layerBench struct {
	Model        string  `json:"model"`
	Experts      int     `json:"experts"`
	TopK         int     `json:"top_k"`
	Seq          int     `json:"seq"` // one sequence of seq tokens
	Threads      int     `json:"threads"`
	Seconds      float64 `json:"seconds"` // best forward + backward
	Forward      float64 `json:"forward_seconds"`
	TokensPerS   float64 `json:"tokens_per_s"`
	ModelFLOPs   int64   `json:"model_flops"` // forward + backward matmul FLOPs, attention exact under the mask, no recompute
	GFLOPS       float64 `json:"gflops"`
	PeakFraction float64 `json:"peak_fraction"`
	cpuRates
}

type torchBench struct {
	Version    string  `json:"version"`
	Threads    int     `json:"threads"`
	Seconds    float64 `json:"seconds"`
	TokensPerS float64 `json:"tokens_per_s"`
	Ratio      float64 `json:"ratio"` // moescope tokens/s ÷ PyTorch tokens/s
	// CPUSeconds is the process CPU time of each timed run (the script's
	// time.process_time; spinning OpenMP/OpenBLAS threads count too).
	CPUSeconds []float64 `json:"cpu_seconds,omitempty"`
}

func runBench(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("bench", stderr)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	model := fs.String("model", "qwen3-30b-a3b", "built-in model name or config.json path whose layer and expert shapes are measured")
	tokens := fs.Int("tokens", 2048, "tokens of the layer benchmark (one sequence)")
	threads := fs.Int("threads", runtime.NumCPU(), "cores the kernels use")
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
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: moescope bench [--json] [--model M] [--tokens N] [--threads N] [--experts E] [--top-k K] [--torch SCRIPT]")
		fs.PrintDefaults()
	}
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
	if *cpuProfile != "" && *skipLayer {
		return fmt.Errorf("%w: --cpuprofile profiles the layer benchmark, which --no-layer skips", errUsage)
	}
	if err := checkOutputs(*force, output{"--cpuprofile", *cpuProfile}); err != nil {
		return err
	}
	squares, err := parseSizes(*sizes)
	if err != nil {
		return err
	}
	cfg, err := moe.Load(*model)
	if err != nil {
		return err
	}
	lc, err := benchLayerConfig(cfg, *experts, *topK)
	if err != nil {
		return err
	}
	if !*skipLayer {
		if err := checkBenchMemory(lc, *tokens, availableMemory()); err != nil {
			return err
		}
	}

	prevProcs := runtime.GOMAXPROCS(*threads)
	defer runtime.GOMAXPROCS(prevProcs)
	prevThreads := kernel.SetThreads(*threads)
	defer kernel.SetThreads(prevThreads)

	rep := benchReport{CPU: kernel.Info(), Threads: *threads}
	rep.Peak = kernel.MeasurePeak(*threads)
	rep.PeakGFLOPS, rep.PeakPerCore = rep.Peak.AllCoreGFLOPS, rep.Peak.PerCoreGFLOPS
	if !*skipGEMM {
		rep.GEMM = benchGEMMs(lc, squares, *tokens, *threads, rep.Peak)
	}
	if !*skipLayer {
		// The profile is collected in memory and written atomically
		// (DESIGN.md, "Files").
		var prof bytes.Buffer
		if *cpuProfile != "" {
			if err := pprof.StartCPUProfile(&prof); err != nil {
				return err
			}
		}
		rep.Layer, err = benchLayer(lc, *model, *tokens, *threads, *iters, rep.Peak)
		if *cpuProfile != "" {
			pprof.StopCPUProfile()
		}
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
	}
	if *torch != "" {
		if rep.Torch, err = runTorch(*python, *torch, lc, *tokens, *threads, *iters); err != nil {
			return err
		}
		if rep.Layer != nil && rep.Torch.TokensPerS > 0 {
			rep.Torch.Ratio = rep.Layer.TokensPerS / rep.Torch.TokensPerS
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printBench(stdout, &rep)
	return nil
}

// benchLayerConfig is cfg cut to one MoE layer with the requested experts
// and top-k, and a tiny vocabulary (the layer does not use it).
func benchLayerConfig(cfg *moe.Config, experts, topK int) (*moe.Config, error) {
	if !cfg.IsMoE() {
		return nil, fmt.Errorf("--model %s has no MoE layer to benchmark", cfg.Name)
	}
	c := *cfg
	l := 0
	for !cfg.MoELayer[l] {
		l++
	}
	c.Layers, c.MoELayer, c.Window = 1, []bool{true}, []int{cfg.Window[l]}
	c.Vocab, c.TiedEmbeddings = 64, false
	if experts > 0 && experts != c.Experts {
		c.Experts, c.Groups, c.TopKGroups = experts, 1, 1
	}
	if topK > 0 {
		c.TopK = topK
	}
	if c.TopK > c.Experts {
		return nil, fmt.Errorf("%w: --top-k %d exceeds the %d experts", errUsage, c.TopK, c.Experts)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// benchHeapFactor scales memory.Estimate's float32 peak allocated bytes of
// the benchmarked layer (no checkpointing) to the process's resident
// memory, erring high. Measured with qwen3-30b-a3b widths, 16 experts, top-4
// (maximum resident set from /usr/bin/time ÷ the estimate): 2048 tokens,
// 1.97 GiB ÷ 1.94 GiB; 8192 tokens, 5.58 GiB ÷ 3.52 GiB.
const benchHeapFactor = 2.0

// checkBenchMemory refuses a layer benchmark whose tokens would not fit in
// avail bytes (0: unknown, no check), instead of being killed by the
// kernel.
func checkBenchMemory(c *moe.Config, tokens int, avail uint64) error {
	l := moe.Layout{GPUs: 1, Sharding: moe.ShardDDP}
	if err := l.Resolve(); err != nil {
		return err
	}
	f32 := moe.Precision{Param: moe.F32, Compute: moe.F32, Grad: moe.F32, Optimizer: moe.F32, Activation: moe.F32}
	r, err := memory.Estimate(c, l, memory.Batch{LBS: 1, Seq: tokens}, memory.Options{Precision: f32, AC: moe.AC{Mode: moe.ACNone}})
	if err != nil {
		return fmt.Errorf("%w: --tokens %d: %v", errUsage, tokens, err)
	}
	need := benchHeapFactor * float64(r.Peak.Allocated)
	if avail > 0 && need > float64(avail) {
		return fmt.Errorf("%w: --tokens %d: the layer benchmark needs about %.1f GiB, only %.1f GiB of memory is available; use fewer --tokens",
			errUsage, tokens, need/(1<<30), float64(avail)/(1<<30))
	}
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

// bestTime runs f in at least minBatches batches of at least batchLen
// each (one run per batch if a run is longer) and returns the shortest wall
// time of a single run and the shortest per-run process CPU time of a batch
// (0 where unknown). CPU time is taken over batches because Linux updates a
// thread's CPU time on other cores only at scheduler ticks.
func bestTime(minBatches int, batchLen time.Duration, f func()) (wall, cpu time.Duration) {
	wall, cpu = time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
	for range minBatches {
		c0, ok := kernel.ProcessCPUTime()
		start, n := time.Now(), 0
		for n == 0 || time.Since(start) < batchLen {
			t := time.Now()
			f()
			wall = min(wall, time.Since(t))
			n++
		}
		c1, _ := kernel.ProcessCPUTime()
		if !ok {
			cpu = 0
			continue
		}
		cpu = min(cpu, (c1-c0)/time.Duration(n))
	}
	return wall, cpu
}

// benchGEMMs times square products (NN) and the expert GEMMs of the layer
// (tokens·K/E rows per expert), on one core and on threads cores.
func benchGEMMs(c *moe.Config, squares []int, tokens, threads int, p kernel.Peak) []gemmBench {
	type shape struct {
		op, layout string
		m, n, k    int
	}
	var shapes []shape
	for _, n := range squares {
		shapes = append(shapes, shape{"square", "NN", n, n, n})
	}
	me := max(1, tokens*c.TopK/c.Experts)
	D, F := c.Hidden, c.ExpertFFN
	shapes = append(shapes,
		shape{"expert gate/up forward", "NT", me, F, D},
		shape{"expert down forward", "NT", me, D, F},
		shape{"expert gate/up dX", "NN", me, D, F},
		shape{"expert down dX", "NN", me, F, D},
		shape{"expert gate/up dW", "TN", F, D, me},
		shape{"expert down dW", "TN", D, F, me},
	)
	counts := []int{1}
	if threads > 1 {
		counts = append(counts, threads)
	}
	r := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = r.Float32() - 0.5
		}
		return s
	}
	var out []gemmBench
	for _, s := range shapes {
		ta, tb := s.layout[0] == 'T', s.layout[1] == 'T'
		a, b, cc := fill(s.m*s.k), fill(s.k*s.n), make([]float32, s.m*s.n)
		lda, ldb := s.k, s.n
		if ta {
			lda = s.m
		}
		if tb {
			ldb = s.k
		}
		for _, t := range counts {
			prev := kernel.SetThreads(t)
			d, cpu := bestTime(3, 150*time.Millisecond, func() {
				kernel.Sgemm(ta, tb, s.m, s.n, s.k, 1, a, lda, b, ldb, 0, cc, s.n)
			})
			kernel.SetThreads(prev)
			flop := 2 * float64(s.m) * float64(s.n) * float64(s.k)
			gf := flop / d.Seconds() / 1e9
			out = append(out, gemmBench{Op: s.op, Layout: s.layout, M: s.m, N: s.n, K: s.k, Threads: t,
				Seconds: d.Seconds(), GFLOPS: gf, PeakFraction: gf / peakFor(p, t),
				cpuRates: newCPURates(flop, cpu, t, peakFor(p, t))})
		}
	}
	return out
}

// peakFor is the peak of t threads: the per-core figure for one, else the
// all-core figure scaled to t of the measured p.Threads.
func peakFor(p kernel.Peak, t int) float64 {
	if t <= 1 {
		return p.PerCoreGFLOPS
	}
	return p.AllCoreGFLOPS * float64(t) / float64(p.Threads)
}

// flopCounter sums the model-convention matmul work the layer records.
type flopCounter struct{ matmul int64 }

func (f *flopCounter) RecordOp(r moe.OpRecord) {
	if r.Pass == moe.Recompute {
		return
	}
	if k := r.Op.Kind(); k == moe.KindMatmul || k == moe.KindGrouped {
		f.matmul += r.Count
	}
}
func (f *flopCounter) RecordSaved(moe.SavedRecord) {}

// benchLayer times one decoder layer of c forward and backward on one
// sequence of tokens, with the reference implementation (package moe).
func benchLayer(c *moe.Config, name string, tokens, threads, iters int, p kernel.Peak) (*layerBench, error) {
	m, err := moe.NewModel[float32](c)
	if err != nil {
		return nil, err
	}
	m.InitRandom(1)
	w, g := m.Layer(0)
	rec := &flopCounter{}
	blk := moe.NewBlock[float32](c, 0, 1, tokens, moe.Options{Recorder: rec, TileQ: kernel.AttnTileQ, TileK: kernel.AttnTileK})
	r := rand.New(rand.NewPCG(3, 4))
	x, dy := make([]float32, tokens*c.Hidden), make([]float32, tokens*c.Hidden)
	for i := range x {
		x[i] = float32(r.NormFloat64())
		dy[i] = float32(r.NormFloat64() * 1e-3)
	}
	// Warm up (grows every buffer) and count one step's matmul work.
	blk.Forward(&w, x)
	blk.Backward(&w, &g, dy, nil)
	matmul := rec.matmul
	// Attention, model convention: the exact unmasked entries n per head,
	// forward 2·n·d multiply-adds, backward 4·n·d (moe/ops.go).
	n := kernel.AttnShape{Seq: tokens, Window: c.Window[0], TileQ: 1, TileK: 1}.Area()
	attn := 6 * n * int64(c.HeadDim) * int64(c.Heads)
	flops := 2 * (matmul + attn)

	bestFwd := time.Duration(math.MaxInt64)
	best, cpu := bestTime(iters, 0, func() {
		t0 := time.Now()
		blk.Forward(&w, x)
		bestFwd = min(bestFwd, time.Since(t0))
		blk.Backward(&w, &g, dy, nil)
	})
	gf := float64(flops) / best.Seconds() / 1e9
	return &layerBench{Model: name, Experts: c.Experts, TopK: c.TopK, Seq: tokens, Threads: threads,
		Seconds: best.Seconds(), Forward: bestFwd.Seconds(), TokensPerS: float64(tokens) / best.Seconds(),
		ModelFLOPs: flops, GFLOPS: gf, PeakFraction: gf / peakFor(p, threads),
		cpuRates: newCPURates(float64(flops), cpu, threads, peakFor(p, threads))}, nil
}

// runTorch runs the PyTorch side-by-side script on the same layer and reads
// the JSON object it prints last.
func runTorch(python, script string, c *moe.Config, tokens, threads, iters int) (*torchBench, error) {
	args := []string{script, "--json",
		"--tokens", strconv.Itoa(tokens), "--threads", strconv.Itoa(threads), "--iters", strconv.Itoa(iters),
		"--hidden", strconv.Itoa(c.Hidden), "--heads", strconv.Itoa(c.Heads), "--kv-heads", strconv.Itoa(c.KVHeads),
		"--head-dim", strconv.Itoa(c.HeadDim), "--experts", strconv.Itoa(c.Experts), "--top-k", strconv.Itoa(c.TopK),
		"--expert-ffn", strconv.Itoa(c.ExpertFFN), "--window", strconv.Itoa(c.Window[0]),
		"--rope-theta", strconv.FormatFloat(c.RopeTheta, 'g', -1, 64), "--eps", strconv.FormatFloat(c.NormEps, 'g', -1, 64)}
	if c.QKNorm == moe.QKNormHead {
		args = append(args, "--qk-norm")
	}
	if c.NormTopK {
		args = append(args, "--norm-topk")
	}
	var out, errb bytes.Buffer
	cmd := exec.Command(python, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("--torch: %s %s: %v: %s", python, script, err, strings.TrimSpace(errb.String()))
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var t torchBench
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &t); err != nil {
		return nil, fmt.Errorf("--torch: reading the script's JSON line: %v", err)
	}
	return &t, nil
}

func printBench(w io.Writer, r *benchReport) {
	c := r.CPU
	fmt.Fprintf(w, "cpu: %s (%s family %d model %d), %d cores, %s; L1d %d KiB, L2 %d KiB, L3 %d KiB; kernel %s\n",
		c.Brand, c.Vendor, c.Family, c.Model, c.PhysicalCores, strings.Join(c.Features, " "),
		c.L1DBytes>>10, c.L2Bytes>>10, c.L3Bytes>>10, c.Kernel)
	p := r.Peak
	fmt.Fprintf(w, "peak (float32 FMA loop, measured, best of 20 runs): clock %.2f GHz, %.1f FLOP/cycle, %.1f GFLOP/s per core, %.1f GFLOP/s on %d threads\n",
		p.ClockGHz, p.FLOPPerCycle, p.PerCoreGFLOPS, p.AllCoreGFLOPS, p.Threads)
	if len(r.GEMM) > 0 {
		fmt.Fprintf(w, "\n%-24s %-6s %6s %6s %6s %7s %9s %6s %11s %9s\n", "gemm", "layout", "m", "n", "k", "threads", "GFLOP/s", "%peak", "GFLOP/s cpu", "%peak cpu")
		for _, g := range r.GEMM {
			fmt.Fprintf(w, "%-24s %-6s %6d %6d %6d %7d %9.1f %5.1f%% %11.1f %8.1f%%\n", g.Op, g.Layout, g.M, g.N, g.K, g.Threads,
				g.GFLOPS, 100*g.PeakFraction, g.CPUGFLOPS, 100*g.CPUPeakFraction)
		}
		fmt.Fprintln(w, "(GFLOP/s: best wall time; cpu: the same work over process CPU time ÷ threads, what the cores delivered while this process held them)")
	}
	if l := r.Layer; l != nil {
		fmt.Fprintf(w, "\nlayer %s (%d experts, top-%d), one sequence of %d tokens, %d threads, forward+backward (best of runs):\n",
			l.Model, l.Experts, l.TopK, l.Seq, l.Threads)
		fmt.Fprintf(w, "  %.3f s (forward %.3f s), %.0f tokens/s, %.1f GFLOP model FLOPs, %.1f GFLOP/s, %.1f%% of peak; cpu time %.3f s: %.1f GFLOP/s, %.1f%%\n",
			l.Seconds, l.Forward, l.TokensPerS, float64(l.ModelFLOPs)/1e9, l.GFLOPS, 100*l.PeakFraction, l.CPUSeconds, l.CPUGFLOPS, 100*l.CPUPeakFraction)
	}
	if t := r.Torch; t != nil {
		fmt.Fprintf(w, "pytorch %s, %d threads, same layer (HF eager attention, per-expert loop): %.3f s, %.0f tokens/s\n",
			t.Version, t.Threads, t.Seconds, t.TokensPerS)
		if t.Ratio > 0 {
			fmt.Fprintf(w, "moescope / pytorch tokens/s: %.2f×\n", t.Ratio)
		}
	}
}
