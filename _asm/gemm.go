package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// gemmKernels emits the GEMM micro-kernels. Each computes one mr×nr tile of
// C from packed panels (see moe/kernel/pack.go):
//
//	t[i][j] = Σ_{p<kc} a[p·mr+i] · b[p·nr+j]
//	c[i·ldc+j] = t[i][j]            (accumulate == 0)
//	c[i·ldc+j] += t[i][j]           (accumulate != 0)
func gemmKernels() {
	// AVX2: the loop also prefetches A 1 KiB (about 40 steps) ahead into
	// L1, about once per 64-byte line of A. Paired with the same kernel
	// without it on the 2-vCPU Sapphire Rapids guest (one process, runs
	// alternated, median of 15 time ratios): 1.01× at 1024³ and 1.09× at
	// 2048³ on one core, 1.03× for the expert dW shape; 512 and 2048 bytes
	// ahead were within 1–3% of 1 KiB.
	gemmKernel("gemmKernel6x16AVX2", 6, 2, YMM, 8, 1024)
	// AVX-512: 24 accumulators, 2 B vectors, 1 broadcast register. A
	// broadcast into a register feeding two FMAs measured 99% of the FMA
	// peak in L1 on Zen 5; an embedded-broadcast memory operand per FMA
	// (twice the loads) 91%. On the Sapphire Rapids guest the same kernel
	// in L1 reaches only 71–81% of its FMA loop: with one broadcast per
	// step instead of twelve 92–98%, with embedded broadcasts 70–74%, and
	// 14×32, 8×48 and 6×64 tiles were no better, so this part's limit is
	// the broadcast loads. OpenBLAS 0.3.21's SkylakeX sgemm (Debian's
	// libopenblas0-pthread under PyTorch) reached 132 and 141 GFLOP/s at
	// 1024³ and 2048³ on one core there, Sgemm with this kernel 137–154 and
	// 134–136.
	// No A prefetch: the pairing used for AVX2 ran this kernel 3–6% faster
	// without it at 1024³, 2048³ and the expert shapes.
	gemmKernel("gemmKernel12x32AVX512", 12, 2, ZMM, 16, 0)
}

// ahead > 0 prefetches packed A that many bytes ahead of the step reading it.
func gemmKernel(name string, mr, nvec int, vec func() reg.VecVirtual, lanes int, ahead int) {
	nr := nvec * lanes
	TEXT(name, NOSPLIT, "func(kc int, a, b, c *float32, ldc int, accumulate int)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s computes a %d×%d tile: c = (or +=) Σ_p a[p·%d+i]·b[p·%d+j] over kc packed steps.", name, mr, nr, mr, nr))
	kc := Load(Param("kc"), GP64())
	a := Load(Param("a"), GP64())
	b := Load(Param("b"), GP64())
	c := Load(Param("c"), GP64())
	ldc := Load(Param("ldc"), GP64())
	SHLQ(Imm(2), ldc) // bytes

	// Warm C's rows while the loop runs, into L2 only: in L1 they would
	// take ways from the sliver the loop rereads for the whole tile (C's
	// rows ldc apart share sets when ldc is a power of two). Paired against
	// PREFETCHT0 on the Sapphire Rapids guest (median of 15 time ratios,
	// two runs on a quiet machine): 0.99–1.03× (10 of 12 above 1) for the
	// 6×16 kernel over 1024³, 2048³ and the expert shapes on one and two
	// cores, 0.97–1.04× (no change) for the 12×32; without any prefetch of
	// C the 6×16 ran 4–16% slower.
	cp := GP64()
	MOVQ(c, cp)
	for i := 0; i < mr; i++ {
		PREFETCHT1(Mem{Base: cp})
		PREFETCHT1(Mem{Base: cp, Disp: nr*4 - 4})
		ADDQ(ldc, cp)
	}

	acc := make([][]reg.VecVirtual, mr)
	for i := range acc {
		acc[i] = make([]reg.VecVirtual, nvec)
		for v := range acc[i] {
			acc[i][v] = vec()
			VXORPS(acc[i][v], acc[i][v], acc[i][v])
		}
	}
	bv := make([]reg.VecVirtual, nvec)
	for v := range bv {
		bv[v] = vec()
	}
	bc := vec()

	step := func(p int) {
		for v := range bv {
			VMOVUPS(Mem{Base: b, Disp: 4 * (p*nr + v*lanes)}, bv[v])
		}
		// At the first step and at each step whose mr floats straddle a
		// 64-byte line: for mr = 6, two prefetches per 96 bytes of A, so
		// every line ahead is touched once or twice.
		if ahead > 0 && (p == 0 || (p*mr*4)/64 != ((p+1)*mr*4-1)/64) {
			PREFETCHT0(Mem{Base: a, Disp: 4*p*mr + ahead})
		}
		for i := 0; i < mr; i++ {
			VBROADCASTSS(Mem{Base: a, Disp: 4 * (p*mr + i)}, bc)
			for v := range bv {
				VFMADD231PS(bv[v], bc, acc[i][v])
			}
		}
	}

	const unroll = 4
	n4 := GP64()
	MOVQ(kc, n4)
	SHRQ(Imm(2), n4)
	JZ(LabelRef(name + "_tail"))
	Label(name + "_loop4")
	for p := 0; p < unroll; p++ {
		step(p)
	}
	ADDQ(U32(4*mr*unroll), a)
	ADDQ(U32(4*nr*unroll), b)
	DECQ(n4)
	JNZ(LabelRef(name + "_loop4"))

	Label(name + "_tail")
	ANDQ(Imm(unroll-1), kc)
	JZ(LabelRef(name + "_store"))
	Label(name + "_loop1")
	step(0)
	ADDQ(U32(4*mr), a)
	ADDQ(U32(4*nr), b)
	DECQ(kc)
	JNZ(LabelRef(name + "_loop1"))

	Label(name + "_store")
	accum := Load(Param("accumulate"), GP64())
	TESTQ(accum, accum)
	JZ(LabelRef(name + "_overwrite"))
	// Every load of C before any store: C's rows ldc apart share their low
	// 12 address bits when ldc is a multiple of 1024 floats, and a load
	// issued behind a store to such an address waits for it ("4K
	// aliasing", Intel's optimization reference manual; the Zen 5 guest
	// behaves alike). Interleaved, 2048³ on one core ran 82–83% of peak
	// there against 87–89% with rows padded to 2064; loads first, 87%
	// unpadded (record zen5-2026-12-03 in moe/kernel).
	MOVQ(c, cp)
	for i := 0; i < mr; i++ {
		for v := 0; v < nvec; v++ {
			VADDPS(Mem{Base: cp, Disp: 4 * v * lanes}, acc[i][v], acc[i][v])
		}
		ADDQ(ldc, cp)
	}
	MOVQ(c, cp)
	for i := 0; i < mr; i++ {
		for v := 0; v < nvec; v++ {
			VMOVUPS(acc[i][v], Mem{Base: cp, Disp: 4 * v * lanes})
		}
		ADDQ(ldc, cp)
	}
	VZEROUPPER()
	RET()

	Label(name + "_overwrite")
	for i := 0; i < mr; i++ {
		for v := 0; v < nvec; v++ {
			VMOVUPS(acc[i][v], Mem{Base: c, Disp: 4 * v * lanes})
		}
		ADDQ(ldc, c)
	}
	VZEROUPPER()
	RET()
}
