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
	gemmKernel("gemmKernel6x16AVX2", 6, 2, YMM, 8)
	// AVX-512: 24 accumulators, 2 B vectors, 1 broadcast register. A
	// broadcast into a register feeding two FMAs measured 99% of the FMA
	// peak in L1 on Zen 5; an embedded-broadcast memory operand per FMA
	// (twice the loads) 91%.
	gemmKernel("gemmKernel12x32AVX512", 12, 2, ZMM, 16)
}

func gemmKernel(name string, mr, nvec int, vec func() reg.VecVirtual, lanes int) {
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

	// Warm C's rows in cache while the loop runs.
	cp := GP64()
	MOVQ(c, cp)
	for i := 0; i < mr; i++ {
		PREFETCHT0(Mem{Base: cp})
		PREFETCHT0(Mem{Base: cp, Disp: nr*4 - 4})
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
	MOVQ(c, cp)
	for i := 0; i < mr; i++ {
		for v := 0; v < nvec; v++ {
			m := Mem{Base: cp, Disp: 4 * v * lanes}
			VADDPS(m, acc[i][v], acc[i][v])
			VMOVUPS(acc[i][v], m)
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
