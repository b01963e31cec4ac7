//go:build !purego

package kernel

import (
	"unsafe"

	"github.com/klauspost/cpuid/v2"
)

// archKernels returns the assembly micro-kernels this CPU supports, fastest
// first.
func archKernels() []*microKernel {
	var ks []*microKernel
	if cpuid.CPU.Supports(cpuid.AVX512F, cpuid.AVX512VL, cpuid.FMA3) {
		ks = append(ks, &microKernel{
			name: "avx512", mr: 12, nr: 32,
			tile: func(kc int, a, b, c []float32, ldc int, accumulate bool) {
				gemmKernel12x32AVX512(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc, boolInt(accumulate))
			},
			fmaLoop: fmaLoopAVX512, loopFLOP: 24 * 32,
		})
	}
	if cpuid.CPU.Supports(cpuid.AVX2, cpuid.FMA3) {
		ks = append(ks, &microKernel{
			name: "avx2", mr: 6, nr: 16,
			tile: func(kc int, a, b, c []float32, ldc int, accumulate bool) {
				gemmKernel6x16AVX2(kc, unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), ldc, boolInt(accumulate))
			},
			fmaLoop: fmaLoopAVX2, loopFLOP: 12 * 16,
		})
	}
	return ks
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func init() {
	if cpuid.CPU.Supports(cpuid.AVX2, cpuid.FMA3) {
		useAsmRows(true)
	}
	if cpuid.CPU.Supports(cpuid.AVX) {
		asmCopyRows = func(dst, src []float32, ld, kc, w int) bool {
			d, s := unsafe.SliceData(dst), unsafe.SliceData(src)
			switch w {
			case 32:
				copyRows32(d, s, ld, kc)
			case 16:
				copyRows16(d, s, ld, kc)
			case 12:
				copyRows12(d, s, ld, kc)
			case 6:
				copyRows6(d, s, ld, kc)
			case 4:
				copyRows4(d, s, ld, kc)
			default:
				return false
			}
			return true
		}
		asmTranspose8 = func(dst []float32, ldd int, src []float32, lds, n int, alpha float32) {
			transpose8(unsafe.SliceData(dst), ldd, unsafe.SliceData(src), lds, n, alpha)
		}
		asmTranspose4 = func(dst []float32, ldd int, src []float32, lds, n int, alpha float32) {
			transpose4(unsafe.SliceData(dst), ldd, unsafe.SliceData(src), lds, n, alpha)
		}
	}
}

// useAsmRows switches the attention row operations and the element-wise
// kernels (SwiGLU, Add, Axpy, RMSNorm's rows) between the assembly (on) and the plain Go versions (off, for
// tests).
func useAsmRows(on bool) {
	useAsmNormRows(on)
	useAsmElementwiseRows(on)
	useAsmAttentionRows(on)
}

// useAsmNormRows switches RMSNorm's row operations (norm.go) between the
// assembly, over the rows' multiple-of-8 prefixes with the plain Go
// version finishing each tail, and the plain Go versions.
func useAsmNormRows(on bool) {
	if !on {
		normSumSqRow, normScaleRow, normDotRow, normDxRow, normDwRow = normSumSqGo, normScaleGo, normDotGo, normDxGo, normDwGo
		return
	}
	normSumSqRow = func(x []float32) float64 {
		n := len(x) &^ 7
		var s float64
		if n > 0 {
			s = normSumSq(&x[0], n)
		}
		return s + normSumSqGo(x[n:])
	}
	normScaleRow = func(y, x, w []float32, r float32) {
		n := len(x) &^ 7
		if n > 0 {
			y, w = y[:len(x)], w[:len(x)]
			normScale(&y[0], &x[0], &w[0], n, r)
		}
		normScaleGo(y[n:], x[n:], w[n:], r)
	}
	normDotRow = func(dy, w, x []float32, r float32) float64 {
		n := len(x) &^ 7
		var s float64
		if n > 0 {
			dy, w = dy[:len(x)], w[:len(x)]
			s = normDot(&dy[0], &w[0], &x[0], n, r)
		}
		return s + normDotGo(dy[n:], w[n:], x[n:], r)
	}
	normDxRow = func(dx, dy, w, x []float32, r, mean float32) {
		n := len(x) &^ 7
		if n > 0 {
			dx, dy, w = dx[:len(x)], dy[:len(x)], w[:len(x)]
			normDx(&dx[0], &dy[0], &w[0], &x[0], n, r, mean)
		}
		normDxGo(dx[n:], dy[n:], w[n:], x[n:], r, mean)
	}
	normDwRow = func(dw, dy, x []float32, r float32) {
		n := len(x) &^ 7
		if n > 0 {
			dw, dy = dw[:len(x)], dy[:len(x)]
			normDw(&dw[0], &dy[0], &x[0], n, r)
		}
		normDwGo(dw[n:], dy[n:], x[n:], r)
	}
}

// useAsmElementwiseRows switches the element-wise rows (elementwise.go:
// Add's, Axpy's, SwiGLU's forward and backward) between the assembly, over
// the rows' multiple-of-8 prefixes with the plain Go version finishing each
// tail, and the plain Go versions.
func useAsmElementwiseRows(on bool) {
	if !on {
		swigluRow, swigluBwdRow, addRowF, axpyRowF = swigluGo, swigluBwdGo, addGo, axpyGo
		return
	}
	addRowF = func(dst, a, b []float32) {
		n := len(dst) &^ 7
		if n > 0 {
			a, b = a[:len(dst)], b[:len(dst)]
			sumRow(&dst[0], &a[0], &b[0], n)
		}
		addGo(dst[n:], a[n:], b[n:])
	}
	axpyRowF = func(y, x []float32, alpha float32) {
		n := len(y) &^ 7
		if n > 0 {
			x = x[:len(y)]
			axpyRow(&y[0], &x[0], n, alpha)
		}
		axpyGo(y[n:], x[n:], alpha)
	}
	swigluRow = func(sg, a, g, u []float32) {
		n := len(g) &^ 7
		if n > 0 {
			sg, a, u = sg[:len(g)], a[:len(g)], u[:len(g)]
			swigluFwd(&sg[0], &a[0], &g[0], &u[0], n)
		}
		swigluGo(sg[n:], a[n:], g[n:], u[n:])
	}
	swigluBwdRow = func(dg, du, da, g, sg, u []float32) {
		n := len(g) &^ 7
		if n > 0 {
			dg, du, da, sg, u = dg[:len(g)], du[:len(g)], da[:len(g)], sg[:len(g)], u[:len(g)]
			swigluBwd(&dg[0], &du[0], &da[0], &g[0], &sg[0], &u[0], n)
		}
		swigluBwdGo(dg[n:], du[n:], da[n:], g[n:], sg[n:], u[n:])
	}
}

// useAsmAttentionRows switches attention's row operations (rows.go) between
// the assembly, over the rows' multiple-of-8 prefixes with the plain Go
// version finishing each tail, and the plain Go versions.
func useAsmAttentionRows(on bool) {
	if !on {
		expSubSumRow, maxRow, scaleRow, dsRow, dotRow = expSubSumGo, maxGo, scaleGo, dsGo, dotGo
		return
	}
	expSubSumRow = func(x []float32, m float32) float32 {
		n := len(x) &^ 7
		var s float32
		if n > 0 {
			s = expSubSum(&x[0], n, m)
		}
		return s + expSubSumGo(x[n:], m)
	}
	maxRow = func(x []float32, m float32) float32 {
		n := len(x) &^ 7
		if n > 0 {
			m = rowMax(&x[0], n, m)
		}
		return maxGo(x[n:], m)
	}
	scaleRow = func(x []float32, a float32) {
		n := len(x) &^ 7
		if n > 0 {
			rowScale(&x[0], n, a)
		}
		scaleGo(x[n:], a)
	}
	dsRow = func(ds, p []float32, d, c float32) {
		n := len(ds) &^ 7
		p = p[:len(ds)]
		if n > 0 {
			rowDS(&ds[0], &p[0], n, d, c)
		}
		dsGo(ds[n:], p[n:], d, c)
	}
	dotRow = func(x, y []float32) float32 {
		n := len(x) &^ 7
		y = y[:len(x)]
		var s float32
		if n > 0 {
			s = rowDot(&x[0], &y[0], n)
		}
		return s + dotGo(x[n:], y[n:])
	}
}

// measureClock returns the core clock in GHz from a chain of dependent
// 1-cycle adds: 16 adds per iteration, one cycle each.
func measureClock() float64 {
	const n = 1 << 20
	return 16 * n / bestOf(func() { addChain(n) }) / 1e9
}
