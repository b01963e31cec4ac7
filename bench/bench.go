// Package bench is the CPU benchmark harness behind `moescope bench`: the
// measured FMA peak of the machine, square and expert-shaped GEMMs of
// moe/kernel, one decoder layer of the reference model forward and backward
// (with its model FLOPs counted by the layer's own recorder), and the same
// layer under PyTorch side by side. Every figure comes with the peak fraction
// it reaches, by wall time and by process CPU time.
//
// It runs ref.Block, so it sits above moe/ref; it sizes the layer run with
// host.Peak, so above memory too, which is why it is a package of its
// own rather than one under moe. Only cmd/moescope imports it.
package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/memory/host"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/kernel"
	"github.com/moescope/moescope/moe/ref"
)

// Report is `moescope bench --json`.
type Report struct {
	CPU         kernel.CPU  `json:"cpu"`
	Peak        kernel.Peak `json:"peak"`
	PeakGFLOPS  float64     `json:"peak_gflops"`          // all-core FMA peak on Threads cores
	PeakPerCore float64     `json:"peak_gflops_per_core"` // one core
	Threads     int         `json:"threads"`
	GEMM        []GEMM      `json:"gemm"`
	Layer       *Layer      `json:"layer,omitempty"`
	Torch       *Torch      `json:"torch,omitempty"`
}

type GEMM struct {
	Op           string  `json:"op"`     // what the shape is: "square" or the expert GEMM it stands for
	Layout       string  `json:"layout"` // NN, NT (A·Bᵀ) or TN (Aᵀ·B)
	M            int     `json:"m"`
	N            int     `json:"n"`
	K            int     `json:"k"`
	Threads      int     `json:"threads"`
	Seconds      float64 `json:"seconds"` // best wall time of repeated calls
	GFLOPS       float64 `json:"gflops"`  // 2·m·n·k / seconds / 1e9
	PeakFraction float64 `json:"peak_fraction"`
	// The same from the median call: on a shared machine the best of many
	// short calls (a 256³ product lasts a quarter of a millisecond) catches
	// a quiet instant that the best of a few long ones does not, so sizes
	// compare fairly by the median.
	MedianGFLOPS       float64 `json:"median_gflops"`
	MedianPeakFraction float64 `json:"median_peak_fraction"`
	CPURates
}

// CPURates is the same work over the process's CPU time divided by the
// threads (best of the runs): on a machine shared with other processes, the
// speed the cores delivered while this process held them. It hides load
// imbalance (a waiting thread uses no CPU), so it bounds the wall-time
// figure from above; equal when the cores are free and the work balanced.
// Absent where the OS does not report process CPU time.
type CPURates struct {
	CPUSeconds      float64 `json:"cpu_seconds,omitempty"` // process CPU time of the best run
	CPUGFLOPS       float64 `json:"gflops_cpu,omitempty"`
	CPUPeakFraction float64 `json:"peak_fraction_cpu,omitempty"`
}

func newCPURates(flop float64, cpu time.Duration, threads int, peak float64) CPURates {
	if cpu <= 0 {
		return CPURates{}
	}
	gf := flop * float64(threads) / cpu.Seconds() / 1e9
	return CPURates{CPUSeconds: cpu.Seconds(), CPUGFLOPS: gf, CPUPeakFraction: gf / peak}
}

type Layer struct {
	Model        string  `json:"model"`
	Experts      int     `json:"experts"`
	TopK         int     `json:"top_k"`
	Seq          int     `json:"seq"` // one sequence of seq tokens
	Threads      int     `json:"threads"`
	Seconds      float64 `json:"seconds"` // best forward + backward
	Forward      float64 `json:"forward_seconds"`
	SetupSeconds float64 `json:"setup_seconds"` // wall time allocating and filling weights, gradients and inputs, before the warm-up step
	TokensPerS   float64 `json:"tokens_per_s"`
	ModelFLOPs   int64   `json:"model_flops"` // forward + backward matmul FLOPs, attention exact under the mask, no recompute
	GFLOPS       float64 `json:"gflops"`
	PeakFraction float64 `json:"peak_fraction"`
	CPURates
}

type Torch struct {
	Version    string  `json:"version"`
	Threads    int     `json:"threads"`
	Seconds    float64 `json:"seconds"`
	TokensPerS float64 `json:"tokens_per_s"`
	Ratio      float64 `json:"ratio"` // moescope tokens/s ÷ PyTorch tokens/s
	// CPUSeconds is the process CPU time of each timed run (the script's
	// time.process_time; spinning OpenMP/OpenBLAS threads count too).
	CPUSeconds []float64 `json:"cpu_seconds,omitempty"`
}

// LayerConfig is cfg cut to one MoE layer with the requested experts
// and top-k, and a tiny vocabulary (the layer does not use it).
func LayerConfig(cfg *moe.Config, experts, topK int) (*moe.Config, error) {
	if !cfg.IsMoE() {
		return nil, fmt.Errorf("--model %s has no MoE layer to benchmark", cfg.Name)
	}
	c := *cfg
	l := 0
	for !cfg.MoELayer[l] {
		l++
	}
	c.Layers, c.MoELayer, c.Window = 1, []bool{true}, []int{cfg.Window[l]}
	if cfg.Chunk != nil || cfg.NoRope != nil {
		return nil, fmt.Errorf("--model %s: Llama 4's chunked and NoPE layers are not benchmarked (bench_layer.py, the PyTorch side of the comparison, runs RoPE with a causal or windowed mask only)", cfg.Name)
	}
	c.Vocab, c.TiedEmbeddings = 64, false
	if experts > 0 && experts != c.Experts {
		c = *withExperts(&c, experts)
	}
	if topK > 0 {
		c.TopK = topK
	}
	if c.TopK > c.Experts {
		return nil, fmt.Errorf("--top-k %d exceeds the %d experts", c.TopK, c.Experts)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// CheckMemory refuses a layer benchmark whose tokens would not fit in
// avail bytes (0: unknown, no check), instead of being killed by the
// kernel. The refusal names the flag to change: --experts when the layer's
// weights, gradients and AdamW moments alone (at one token) do not fit,
// with the most experts that do; --tokens otherwise.
func CheckMemory(c *moe.Config, tokens int, avail uint64) error {
	need, err := layerBytes(c, tokens)
	if err != nil {
		return fmt.Errorf("--tokens %d: %v", tokens, err)
	}
	if avail == 0 || need <= float64(avail) {
		return nil
	}
	gib := func(b float64) float64 { return b / (1 << 30) }
	fixed, err := layerBytes(c, 1)
	if err != nil {
		return fmt.Errorf("--experts %d: %v", c.Experts, err)
	}
	if fixed <= float64(avail) {
		return fmt.Errorf("--tokens %d: the layer benchmark needs about %.1f GiB, only %.1f GiB of memory is available; use fewer --tokens",
			tokens, gib(need), gib(float64(avail)))
	}
	// Too many experts: the largest count in [top-k, experts) that fits at
	// these tokens (the need grows with the experts).
	fits := func(e int) bool {
		b, err := layerBytes(withExperts(c, e), tokens)
		return err == nil && b <= float64(avail)
	}
	lo, hi := c.TopK-1, c.Experts // fits(lo) is assumed, fits(hi) is false
	for hi-lo > 1 {
		if m := lo + (hi-lo)/2; fits(m) {
			lo = m
		} else {
			hi = m
		}
	}
	msg := fmt.Sprintf("--experts: the layer's %d experts need about %.1f GiB (weights, gradients and AdamW moments) at any --tokens, only %.1f GiB of memory is available",
		c.Experts, gib(fixed), gib(float64(avail)))
	if lo < c.TopK || !fits(lo) {
		return fmt.Errorf("%s; even %d experts (the top-k) do not fit at --tokens %d: use a smaller --top-k, --experts and --tokens", msg, c.TopK, tokens)
	}
	return fmt.Errorf("%s; give --experts in [%d, %d] (at --tokens %d)", msg, c.TopK, lo, tokens)
}

// layerBytes is the resident memory of the layer benchmark at tokens:
// host.Peak of one rank without checkpointing (the float32 peak
// allocated bytes × host.HeapFactor).
func layerBytes(c *moe.Config, tokens int) (float64, error) {
	l := job.Layout{GPUs: 1, Sharding: job.ShardDDP}
	if err := l.Resolve(); err != nil {
		return 0, err
	}
	b, _, err := host.Peak(c, l, memory.Batch{LBS: 1, Seq: tokens}, moe.AC{Mode: moe.ACNone})
	return b, err
}

// withExperts is c with e routed experts in one group, as LayerConfig
// cuts it.
func withExperts(c *moe.Config, e int) *moe.Config {
	d := *c
	d.Experts, d.Groups, d.TopKGroups = e, 1, 1
	return &d
}

// bestTime runs f in at least minBatches batches of at least batchLen
// each (one run per batch if a run is longer) and returns the shortest wall
// time of a single run, the median wall time of the runs, and the shortest
// per-run process CPU time of a batch (0 where unknown). CPU time is taken
// over batches because Linux updates a thread's CPU time on other cores only
// at scheduler ticks.
func bestTime(minBatches int, batchLen time.Duration, f func()) (wall, median, cpu time.Duration) {
	wall, cpu = time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
	var runs []time.Duration
	for range minBatches {
		c0, ok := kernel.ProcessCPUTime()
		start, n := time.Now(), 0
		for n == 0 || time.Since(start) < batchLen {
			t := time.Now()
			f()
			d := time.Since(t)
			wall = min(wall, d)
			runs = append(runs, d)
			n++
		}
		c1, _ := kernel.ProcessCPUTime()
		if !ok {
			cpu = 0
			continue
		}
		cpu = min(cpu, (c1-c0)/time.Duration(n))
	}
	slices.Sort(runs)
	return wall, runs[len(runs)/2], cpu
}

// GEMMs times square products (NN) and the expert GEMMs of the layer
// (tokens·K/E rows per expert), on one core and on threads cores.
func GEMMs(c *moe.Config, squares []int, tokens, threads int, p kernel.Peak) []GEMM {
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
	var out []GEMM
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
			d, med, cpu := bestTime(3, 150*time.Millisecond, func() {
				kernel.Sgemm(ta, tb, s.m, s.n, s.k, 1, a, lda, b, ldb, 0, cc, s.n)
			})
			kernel.SetThreads(prev)
			flop := 2 * float64(s.m) * float64(s.n) * float64(s.k)
			gf, gfMed := flop/d.Seconds()/1e9, flop/med.Seconds()/1e9
			out = append(out, GEMM{Op: s.op, Layout: s.layout, M: s.m, N: s.n, K: s.k, Threads: t,
				Seconds: d.Seconds(), GFLOPS: gf, PeakFraction: gf / peakFor(p, t),
				MedianGFLOPS: gfMed, MedianPeakFraction: gfMed / peakFor(p, t),
				CPURates: newCPURates(flop, cpu, t, peakFor(p, t))})
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
// sequence of tokens, with the reference implementation (package moe/ref).
func RunLayer(c *moe.Config, name string, tokens, threads, iters int, p kernel.Peak) (*Layer, error) {
	// Collect each step's garbage (its output and input gradient: the
	// block recycles its activations) at a quarter of the live heap (the
	// layer's weights, gradients and recycled buffers) rather than at Go's
	// default of the whole live heap again, so the resident set follows the
	// request: the weights, a step's activations and a margin.
	defer debug.SetGCPercent(debug.SetGCPercent(25))
	start := time.Now()
	m, err := ref.NewModel[float32](c)
	if err != nil {
		return nil, err
	}
	randomize(m, 1)
	w, g := m.Layer(0)
	rec := &flopCounter{}
	blk := ref.NewBlock[float32](c, 0, 1, tokens, ref.Options{Recorder: rec, TileQ: kernel.AttnTileQ, TileK: kernel.AttnTileK})
	r := rand.New(rand.NewPCG(3, 4))
	x, dy := make([]float32, tokens*c.Hidden), make([]float32, tokens*c.Hidden)
	for i := range x {
		x[i] = float32(r.NormFloat64())
		dy[i] = float32(r.NormFloat64() * 1e-3)
	}
	setup := time.Since(start)
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
	best, _, cpu := bestTime(iters, 0, func() {
		t0 := time.Now()
		blk.Forward(&w, x)
		bestFwd = min(bestFwd, time.Since(t0))
		blk.Backward(&w, &g, dy, nil)
	})
	gf := float64(flops) / best.Seconds() / 1e9
	return &Layer{Model: name, Experts: c.Experts, TopK: c.TopK, Seq: tokens, Threads: threads,
		Seconds: best.Seconds(), Forward: bestFwd.Seconds(), SetupSeconds: setup.Seconds(), TokensPerS: float64(tokens) / best.Seconds(),
		ModelFLOPs: flops, GFLOPS: gf, PeakFraction: gf / peakFor(p, threads),
		CPURates: newCPURates(float64(flops), cpu, threads, peakFor(p, threads))}, nil
}

// randomize fills m's parameters by the roles InitRandom gives them (RMSNorm
// weights 1, other vectors 0, matrices random with standard deviation
// InitRange), but uniform in ±√3·InitRange (the same variance) and on every
// core: chunks of 2^20 elements each draw from their own generator seeded
// by (seed, chunk), so the values do not depend on the thread count.
// InitRandom's one sequential stream of normal draws took 1.8 s for the 94M
// parameters of the default layer on the build machine; the benchmark
// needs plausible magnitudes (the router's logits, hence the experts'
// loads), not those exact values.
func randomize(m *ref.Model[float32], seed uint64) {
	const chunk = 1 << 20
	half := float32(math.Sqrt(3) * m.Cfg.InitRange)
	for i, t := range m.Tensors() {
		p := m.Params[i]
		switch {
		case p.Group == moe.GroupNorm:
			for j := range t {
				t[j] = 1
			}
		case len(p.Shape) == 1:
			clear(t)
		default:
			kernel.ParallelFor((len(t)+chunk-1)/chunk, chunk, func(lo, hi int) {
				for c := lo; c < hi; c++ {
					r := rand.NewPCG(seed, uint64(i)<<32|uint64(c))
					v := t[c*chunk : min((c+1)*chunk, len(t))]
					for j := 0; j < len(v); j += 2 {
						// two uniforms in [−1, 1) from the 24-bit halves of one draw
						u := r.Uint64()
						v[j] = half * (float32(u>>40)/(1<<23) - 1)
						if j+1 < len(v) {
							v[j+1] = half * (float32(u>>8&(1<<24-1))/(1<<23) - 1)
						}
					}
				}
			})
		}
	}
}

// RunTorch runs the PyTorch side-by-side script on the same layer and reads
// the JSON object it prints last.
func RunTorch(python, script string, c *moe.Config, tokens, threads, iters int) (*Torch, error) {
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
	var t Torch
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &t); err != nil {
		return nil, fmt.Errorf("--torch: reading the script's JSON line: %v", err)
	}
	return &t, nil
}

// Options is one run of the harness; the zero value of a field means its
// part is skipped where that applies.
type Options struct {
	Model   string    // name reported for the layer
	Tokens  int       // tokens of the layer benchmark (one sequence)
	Threads int       // cores the kernels use
	Iters   int       // timed forward+backward runs of the layer (the best is reported)
	Squares []int     // sizes of the square GEMMs
	GEMMs   bool      // time the GEMM table
	Layer   bool      // time the layer
	Profile io.Writer // if set, a CPU profile of the layer benchmark is written to it
	Torch   string    // PyTorch side-by-side script (testdata/torchref/bench_layer.py); "" skips it
	Python  string    // interpreter for Torch
}

// Run measures the CPU's FMA peak, then the GEMMs, the layer of c
// (LayerConfig) and the PyTorch script as o asks, on o.Threads cores.
func Run(c *moe.Config, o Options) (*Report, error) {
	prevProcs := runtime.GOMAXPROCS(o.Threads)
	defer runtime.GOMAXPROCS(prevProcs)
	prevThreads := kernel.SetThreads(o.Threads)
	defer kernel.SetThreads(prevThreads)

	rep := &Report{CPU: kernel.Info(), Threads: o.Threads}
	rep.Peak = kernel.MeasurePeak(o.Threads)
	rep.PeakGFLOPS, rep.PeakPerCore = rep.Peak.AllCoreGFLOPS, rep.Peak.PerCoreGFLOPS
	if o.GEMMs {
		rep.GEMM = GEMMs(c, o.Squares, o.Tokens, o.Threads, rep.Peak)
	}
	if o.Layer {
		if o.Profile != nil {
			if err := pprof.StartCPUProfile(o.Profile); err != nil {
				return nil, err
			}
		}
		var err error
		rep.Layer, err = RunLayer(c, o.Model, o.Tokens, o.Threads, o.Iters, rep.Peak)
		if o.Profile != nil {
			pprof.StopCPUProfile()
		}
		if err != nil {
			return nil, err
		}
	}
	if o.Torch != "" {
		var err error
		if rep.Torch, err = RunTorch(o.Python, o.Torch, c, o.Tokens, o.Threads, o.Iters); err != nil {
			return nil, err
		}
		if rep.Layer != nil && rep.Torch.TokensPerS > 0 {
			rep.Torch.Ratio = rep.Layer.TokensPerS / rep.Torch.TokensPerS
		}
	}
	return rep, nil
}
