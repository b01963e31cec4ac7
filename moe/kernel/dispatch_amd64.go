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
	if cpuid.CPU.Supports(cpuid.AVX) {
		asmTranspose8 = func(dst []float32, ldd int, src []float32, lds, n int, alpha float32) {
			transpose8(unsafe.SliceData(dst), ldd, unsafe.SliceData(src), lds, n, alpha)
		}
		asmTranspose4 = func(dst []float32, ldd int, src []float32, lds, n int, alpha float32) {
			transpose4(unsafe.SliceData(dst), ldd, unsafe.SliceData(src), lds, n, alpha)
		}
	}
}

// measureClock returns the core clock in GHz from a chain of dependent
// 1-cycle adds: 16 adds per iteration, one cycle each.
func measureClock() float64 {
	const n = 1 << 20
	return 16 * n / bestOf(func() { addChain(n) }) / 1e9
}
