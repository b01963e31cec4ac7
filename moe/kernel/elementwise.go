package kernel

import (
	"math"
	"sync"
)

// Element-wise work of the reference model (norms, activations, residual
// adds, permutations) on the worker pool: ParallelFor splits an index range
// into one contiguous chunk per core, so a loop body that writes only the
// indices it is given computes exactly what the serial loop computes. The
// SwiGLU activations also run in AVX2 vectors where the CPU has them.

// parallelMinElems is the work (indices × cost) below which ParallelFor
// stays on the caller: a fork/join costs about a microsecond, a plain loop
// touches about a thousand elements in that time.
const parallelMinElems = 1 << 15

// ParallelFor runs f(lo, hi) over contiguous chunks that cover [0, n)
// once, on up to Threads() cores, and returns when all are done. cost is the
// caller's estimate of the elements one index touches; below
// parallelMinElems of work in all, or while another goroutine's kernel holds
// the pool, f(0, n) runs on the caller. f must write only what indices
// [lo, hi) own.
func ParallelFor(n, cost int, f func(lo, hi int)) {
	if n <= 0 {
		return
	}
	parts := min(Threads(), n)
	if parts <= 1 || n*max(cost, 1) < parallelMinElems {
		f(0, n)
		return
	}
	c := forCalls.Get().(*forCall)
	c.f, c.n, c.chunk = f, n, (n+parts-1)/parts
	parallel((n+c.chunk-1)/c.chunk, c)
	c.f = nil
	forCalls.Put(c)
}

// forCall is one ParallelFor: task t runs the t-th chunk.
type forCall struct {
	f        func(lo, hi int)
	n, chunk int
}

var forCalls = sync.Pool{New: func() any { return new(forCall) }}

func (c *forCall) task(_ *arena, t int) {
	c.f(t*c.chunk, min((t+1)*c.chunk, c.n))
}

// Row versions of the SwiGLU activations: the plain-Go loops below are the
// oracle (the same formulas, in the same order, as package moe/ref's generic
// ones); dispatch_amd64.go replaces them with AVX2 assembly.
var (
	swigluRow    = swigluGo
	swigluBwdRow = swigluBwdGo
	addRowF      = addGo
	axpyRowF     = axpyGo
)

// Add sets dst[i] = a[i] + b[i] for i < len(dst), on every core, in AVX2
// vectors where the CPU has them (the same bits as the plain loop: IEEE
// adds).
func Add(dst, a, b []float32) {
	n := len(dst)
	if len(a) < n || len(b) < n {
		panic("kernel: Add: slices shorter than dst")
	}
	ParallelFor(n, 3, func(lo, hi int) { addRowF(dst[lo:hi], a[lo:hi], b[lo:hi]) })
}

// Axpy sets y[i] += alpha·x[i] for i < len(y), the product rounded before
// the sum (the bits of the Go statement y[i] += alpha * x[i]), on the
// calling goroutine in AVX2 vectors where the CPU has them. It is a row
// operation: callers split rows over the cores with ParallelFor.
func Axpy(y, x []float32, alpha float32) {
	if len(x) < len(y) {
		panic("kernel: Axpy: x shorter than y")
	}
	axpyRowF(y, x, alpha)
}

func addGo(dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}

func axpyGo(y, x []float32, alpha float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += alpha * x[i]
	}
}

// SwiGLU sets sg[i] = g[i]·σ(g[i]) (SiLU) and a[i] = sg[i]·u[i] for i <
// len(g), σ(x) = 1/(1 + e^−x), in parallel. The AVX2 path computes σ with a
// float32 exp (relative error about 1e-7) where the plain loop rounds the
// float64 σ, so the two differ by a few units in the last place.
func SwiGLU(sg, a, g, u []float32) {
	n := len(g)
	if len(sg) < n || len(a) < n || len(u) < n {
		panic("kernel: SwiGLU: slices shorter than g")
	}
	ParallelFor(n, 8, func(lo, hi int) { swigluRow(sg[lo:hi], a[lo:hi], g[lo:hi], u[lo:hi]) })
}

// SwiGLUBackward sets du[i] = da[i]·sg[i] and dg[i] =
// da[i]·u[i]·σ(g[i])·(1 + g[i]·(1 − σ(g[i]))) (SiLU's derivative) for i <
// len(g), in parallel, from SwiGLU's inputs g, u and its output sg.
func SwiGLUBackward(dg, du, da, g, sg, u []float32) {
	n := len(g)
	if len(dg) < n || len(du) < n || len(da) < n || len(sg) < n || len(u) < n {
		panic("kernel: SwiGLUBackward: slices shorter than g")
	}
	ParallelFor(n, 8, func(lo, hi int) {
		swigluBwdRow(dg[lo:hi], du[lo:hi], da[lo:hi], g[lo:hi], sg[lo:hi], u[lo:hi])
	})
}

func sigmoidGo(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

func swigluGo(sg, a, g, u []float32) {
	sg, a, u = sg[:len(g)], a[:len(g)], u[:len(g)]
	for i, v := range g {
		sg[i] = v * sigmoidGo(v)
		a[i] = sg[i] * u[i]
	}
}

func swigluBwdGo(dg, du, da, g, sg, u []float32) {
	dg, du, da, sg, u = dg[:len(g)], du[:len(g)], da[:len(g)], sg[:len(g)], u[:len(g)]
	for i, v := range g {
		sig := sigmoidGo(v)
		d := da[i]
		du[i] = d * sg[i]
		dg[i] = d * u[i] * sig * (1 + v*(1-sig))
	}
}
