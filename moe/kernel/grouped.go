package kernel

import (
	"slices"
	"sync"
)

// Grouped expert GEMMs. Routed tokens are sorted by expert, so expert e owns
// the contiguous rows [offsets[e], offsets[e+1]) of the token matrices
// (len(offsets) = E+1, offsets[0] = 0, non-decreasing; a group may be
// empty). Expert e's weight w[e] is an n×k row-major matrix (a linear layer
// mapping k inputs to n outputs, as PyTorch stores it). With X_e, Y_e the
// group's rows:
//
//	GroupedLinear:               Y_e  = X_e·W_eᵀ     (overwrites y)
//	GroupedLinearBackwardData:   dX_e += dY_e·W_e    (accumulates)
//	GroupedLinearBackwardWeight: dW_e += dY_eᵀ·X_e   (accumulates)
//
// x and dx are T×k, y and dy T×n (row strides k and n), T = offsets[E].
// Every pass costs Σ_e M_e·n·k multiply-adds (M_e the group's rows). Experts
// run in parallel over Threads() cores, each on one core.

// GroupedLinear computes y[r] = x[r]·w[e]ᵀ for every row r of every group e.
func GroupedLinear(y, x []float32, w [][]float32, offsets []int, n, k int) {
	runGrouped(groupedFwd, y, x, w, offsets, n, k)
}

// GroupedLinearBackwardData accumulates dx[r] += dy[r]·w[e] for every row r
// of every group e.
func GroupedLinearBackwardData(dx, dy []float32, w [][]float32, offsets []int, n, k int) {
	runGrouped(groupedBwdData, dx, dy, w, offsets, n, k)
}

// GroupedLinearBackwardWeight accumulates dw[e] += dy[rows of e]ᵀ·x[rows of
// e] for every group e.
func GroupedLinearBackwardWeight(dw [][]float32, dy, x []float32, offsets []int, n, k int) {
	runGrouped(groupedBwdWeight, dy, x, dw, offsets, n, k)
}

type groupedKind uint8

const (
	groupedFwd groupedKind = iota
	groupedBwdData
	groupedBwdWeight
)

// groupedCall is one grouped GEMM; s and t are the two token matrices in the
// argument order of the exported function, w the per-expert matrices.
type groupedCall struct {
	kind    groupedKind
	s, t    []float32
	w       [][]float32
	offsets []int
	n, k    int
	order   []int // the experts, most rows first (largestFirst)
}

var groupedCalls = sync.Pool{New: func() any { return new(groupedCall) }}

func runGrouped(kind groupedKind, s, t []float32, w [][]float32, offsets []int, n, k int) {
	checkGrouped(kind, s, t, w, offsets, n, k)
	g := groupedCalls.Get().(*groupedCall)
	*g = groupedCall{kind: kind, s: s, t: t, w: w, offsets: offsets, n: n, k: k,
		order: largestFirst(g.order, offsets)}
	parallel(len(g.order), g)
	*g = groupedCall{order: g.order[:0]}
	groupedCalls.Put(g)
}

// largestFirst returns the experts 0..E−1 of offsets in order of decreasing
// rows (ties by index), reusing order's storage. The cores claim experts in
// this order: a core that finds the others still busy then takes a small
// expert, so the idle tail of the call is at most the smallest expert's
// time, where claiming by index leaves whatever expert comes last (Graham's
// longest-processing-time rule, within 4/3 of the best split).
func largestFirst(order, offsets []int) []int {
	order = order[:0]
	for e := range len(offsets) - 1 {
		order = append(order, e)
	}
	rows := func(e int) int { return offsets[e+1] - offsets[e] }
	slices.SortStableFunc(order, func(a, b int) int { return rows(b) - rows(a) })
	return order
}

// checkGrouped panics with a constant message on inconsistent arguments.
func checkGrouped(kind groupedKind, s, t []float32, w [][]float32, offsets []int, n, k int) {
	if n < 0 || k < 0 || len(offsets) == 0 || offsets[0] != 0 || len(w) != len(offsets)-1 {
		panic("kernel: grouped GEMM: need len(offsets) = len(w)+1, offsets[0] = 0, n, k ≥ 0")
	}
	for e := range w {
		if offsets[e+1] < offsets[e] {
			panic("kernel: grouped GEMM: offsets decrease")
		}
		if len(w[e]) < n*k {
			panic("kernel: grouped GEMM: an expert matrix is shorter than n·k")
		}
	}
	rows := offsets[len(offsets)-1]
	sCols, tCols := n, k // forward: y T×n, x T×k; backward data: dx T×k, dy T×n
	if kind != groupedFwd {
		sCols, tCols = tCols, sCols
	}
	if kind == groupedBwdWeight {
		sCols, tCols = n, k // dy T×n, x T×k
	}
	if len(s) < rows*sCols || len(t) < rows*tCols {
		panic("kernel: grouped GEMM: token matrix shorter than offsets[E] rows")
	}
}

// task runs the GEMM of expert order[t] on one core.
func (g *groupedCall) task(ar *arena, t int) {
	e := g.order[t]
	r0, r1 := g.offsets[e], g.offsets[e+1]
	m, n, k := r1-r0, g.n, g.k
	if m == 0 {
		return
	}
	switch g.kind {
	case groupedFwd: // y = x·Wᵀ: [m×k]·[n×k]ᵀ
		sgemmSeq(ar, false, true, m, n, k, 1, g.t[r0*k:], k, g.w[e], k, 0, g.s[r0*n:], n)
	case groupedBwdData: // dx += dy·W: [m×n]·[n×k]
		sgemmSeq(ar, false, false, m, k, n, 1, g.t[r0*n:], n, g.w[e], k, 1, g.s[r0*k:], k)
	case groupedBwdWeight: // dW += dyᵀ·x: [m×n]ᵀ·[m×k]
		sgemmSeq(ar, true, false, n, k, m, 1, g.s[r0*n:], n, g.t[r0*k:], k, 1, g.w[e], k)
	}
}

// sgemmSeq is Sgemm on the calling goroutine with the caller's arena, for
// kernels that are already parallel at a coarser grain. Arguments are not
// checked.
func sgemmSeq(ar *arena, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		scaleC(m, n, beta, c, ldc)
		return
	}
	g := gemmCall{mk: active(), transA: transA, transB: transB, m: m, n: n, k: k,
		alpha: alpha, a: a, lda: lda, b: b, ldb: ldb, beta: beta, c: c, ldc: ldc}
	g.bs = blockSizes(g.mk, false)
	g.block(ar, 0, m, 0, n)
}
