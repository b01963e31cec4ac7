package kernel

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

var (
	peakOnce sync.Once
	peakVal  Peak
)

// benchPeak is the machine's peak for the active kernel, measured once.
func benchPeak() Peak {
	peakOnce.Do(func() { peakVal = MeasurePeak(0) })
	return peakVal
}

// reportGFLOPS reports GFLOP/s and the fraction of the per-core or all-core
// peak (percent) for flop FLOP per iteration on threads cores.
func reportGFLOPS(b *testing.B, flop float64, threads int) {
	p := benchPeak()
	gf := flop * float64(b.N) / b.Elapsed().Seconds() / 1e9
	peak := p.PerCoreGFLOPS
	if threads > 1 {
		peak = p.AllCoreGFLOPS * float64(threads) / float64(p.Threads)
	}
	b.ReportMetric(gf, "GFLOP/s")
	b.ReportMetric(100*gf/peak, "%peak")
}

func BenchmarkSgemm(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, threads := range []int{1, 2} {
		for _, n := range []int{256, 512, 1024, 2048} {
			for _, layout := range []struct {
				name   string
				ta, tb bool
			}{{"NN", false, false}, {"NT", false, true}, {"TN", true, false}} {
				b.Run(fmt.Sprintf("%s/%d/threads=%d", layout.name, n, threads), func(b *testing.B) {
					a, bb, c := randSlice(r, n*n), randSlice(r, n*n), make([]float32, n*n)
					prev := SetThreads(threads)
					defer SetThreads(prev)
					Sgemm(layout.ta, layout.tb, n, n, n, 1, a, n, bb, n, 0, c, n)
					for b.Loop() {
						Sgemm(layout.ta, layout.tb, n, n, n, 1, a, n, bb, n, 0, c, n)
					}
					reportGFLOPS(b, 2*float64(n)*float64(n)*float64(n), threads)
				})
			}
		}
	}
}

// noopTasks is a parallel call that does nothing: its cost is the pool's.
type noopTasks struct{}

func (noopTasks) task(*arena, int) {}

// BenchmarkPool measures one fork/join of the worker pool over Threads()
// goroutines with empty tasks: what a parallel kernel call pays before any
// work.
func BenchmarkPool(b *testing.B) {
	prev := SetThreads(2)
	defer SetThreads(prev)
	for b.Loop() {
		parallel(2, noopTasks{})
	}
}

// BenchmarkGrouped runs the three grouped GEMMs of an expert layer with
// Qwen3-30B-A3B widths (D = 2048, F = 768), 16 experts, 2048 tokens, top-4:
// 512 rows per expert.
func BenchmarkGrouped(b *testing.B) {
	const E, rows, D, F = 16, 512, 2048, 768
	r := rand.New(rand.NewPCG(2, 2))
	offsets := make([]int, E+1)
	w, dw := make([][]float32, E), make([][]float32, E)
	for e := range E {
		offsets[e+1] = offsets[e] + rows
		w[e], dw[e] = randSlice(r, F*D), make([]float32, F*D)
	}
	x, y, dy, dx := randSlice(r, E*rows*D), make([]float32, E*rows*F), randSlice(r, E*rows*F), make([]float32, E*rows*D)
	flop := 2 * float64(E*rows) * F * D
	for _, threads := range []int{1, 2} {
		prev := SetThreads(threads)
		b.Run(fmt.Sprintf("forward/threads=%d", threads), func(b *testing.B) {
			for b.Loop() {
				GroupedLinear(y, x, w, offsets, F, D)
			}
			reportGFLOPS(b, flop, threads)
		})
		b.Run(fmt.Sprintf("backward_data/threads=%d", threads), func(b *testing.B) {
			for b.Loop() {
				GroupedLinearBackwardData(dx, dy, w, offsets, F, D)
			}
			reportGFLOPS(b, flop, threads)
		})
		b.Run(fmt.Sprintf("backward_weight/threads=%d", threads), func(b *testing.B) {
			for b.Loop() {
				GroupedLinearBackwardWeight(dw, dy, x, offsets, F, D)
			}
			reportGFLOPS(b, flop, threads)
		})
		SetThreads(prev)
	}
}

// BenchmarkAttention runs causal attention on one sequence of 2048 with 32
// query and 4 KV heads of 128 (Qwen3-30B-A3B), reporting model FLOPs:
// forward 4·n·d·H, backward 8·n·d·H, n = s(s+1)/2.
func BenchmarkAttention(b *testing.B) {
	a := AttnShape{Batch: 1, Seq: 2048, Heads: 32, KVHeads: 4, HeadDim: 128}
	r := rand.New(rand.NewPCG(3, 3))
	T := a.Seq
	q, k, v := randSlice(r, T*a.Heads*a.HeadDim), randSlice(r, T*a.KVHeads*a.HeadDim), randSlice(r, T*a.KVHeads*a.HeadDim)
	do := randSlice(r, len(q))
	o, lse := make([]float32, len(q)), make([]float32, T*a.Heads)
	dq, dk, dv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
	n := float64(AttnShape{Seq: a.Seq, TileQ: 1, TileK: 1}.Area()) * float64(a.HeadDim*a.Heads)
	for _, threads := range []int{1, 2} {
		prev := SetThreads(threads)
		b.Run(fmt.Sprintf("forward/threads=%d", threads), func(b *testing.B) {
			for b.Loop() {
				AttentionForward(o, lse, q, k, v, a)
			}
			reportGFLOPS(b, 4*n, threads)
		})
		b.Run(fmt.Sprintf("backward/threads=%d", threads), func(b *testing.B) {
			for b.Loop() {
				AttentionBackward(dq, dk, dv, do, q, k, v, o, lse, a)
			}
			reportGFLOPS(b, 8*n, threads)
		})
		SetThreads(prev)
	}
}

// benchRowOps runs forward and backward, element-wise operations over
// elems elements, with the assembly rows and with the plain-Go loops, on
// one and two cores, reporting elements per second.
func benchRowOps(b *testing.B, elems int, forward, backward func()) {
	for _, path := range []string{"asm", "go"} {
		useAsmRows(path == "asm")
		for _, threads := range []int{1, 2} {
			prev := SetThreads(threads)
			for _, op := range []struct {
				name string
				f    func()
			}{{"forward", forward}, {"backward", backward}} {
				b.Run(fmt.Sprintf("%s/%s/threads=%d", path, op.name, threads), func(b *testing.B) {
					for b.Loop() {
						op.f()
					}
					b.ReportMetric(float64(elems)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gelem/s")
				})
			}
			SetThreads(prev)
		}
	}
	useAsmRows(true)
}

// BenchmarkSwiGLU runs the SwiGLU activation forward and backward over the
// expert rows of the default bench layer (2048 tokens × top-4 = 8192 rows of
// F = 768) (benchRowOps).
func BenchmarkSwiGLU(b *testing.B) {
	const n = 8192 * 768
	r := rand.New(rand.NewPCG(4, 4))
	g, u, da := randSlice(r, n), randSlice(r, n), randSlice(r, n)
	sg, a, dg, du := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	benchRowOps(b, n, func() { SwiGLU(sg, a, g, u) }, func() { SwiGLUBackward(dg, du, da, g, sg, u) })
}

// BenchmarkRMSNorm runs RMSNorm forward and backward over the rows of the
// default bench layer (2048 tokens of D = 2048) (benchRowOps).
func BenchmarkRMSNorm(b *testing.B) {
	const rows, n = 2048, 2048
	r := rand.New(rand.NewPCG(6, 6))
	x, w, dy := normInputs(r, rows, n)
	y, rstd, dx, dw := make([]float32, rows*n), make([]float32, rows), make([]float32, rows*n), make([]float32, n)
	benchRowOps(b, rows*n, func() { RMSNorm(y, rstd, x, w, n, 1e-6) }, func() { RMSNormBackward(dx, dw, dy, x, rstd, w, n) })
}
