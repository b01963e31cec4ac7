package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// normOps emits the AVX2 row operations of RMSNorm (moe/kernel/norm.go).
// Each handles n elements, n a multiple of 8 (the Go caller does the tail).
// The element-wise ones round every product and difference as the plain Go
// statement does (no fused multiply-add), so they keep its bits; the two
// sums add in float64 lanes, where the Go loops add one element after
// another.
func normOps() {
	normSumSq()
	normScale()
	normDot()
	normDx()
	normDw()
}

// bcastParam loads the float32 parameter name into all 8 lanes.
func bcastParam(name string) reg.VecVirtual {
	x := Load(Param(name), XMM())
	v := YMM()
	VBROADCASTSS(x, v)
	return v
}

// loop8 emits the loop over n/8 vectors of 8 around body, advancing ptrs
// by 32 bytes each time, and returns after the done label.
func loop8(name string, n reg.Register, ptrs []reg.Register, body func()) {
	SHRQ(Imm(3), n)
	JZ(LabelRef(name + "_done"))
	Label(name + "_loop")
	body()
	for _, p := range ptrs {
		ADDQ(U8(32), p)
	}
	DECQ(n)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
}

// hsumPD returns acc's four float64 lanes added, in the low lane of acc.
func hsumPD(acc reg.VecVirtual) {
	hi := XMM()
	VEXTRACTF128(Imm(1), acc, hi)
	lo := acc.AsX()
	VADDPD(hi, lo, lo)
	VHADDPD(lo, lo, lo)
}

func normSumSq() {
	TEXT("normSumSq", NOSPLIT, "func(x *float32, n int) float64")
	Pragma("noescape")
	Doc("normSumSq returns Σ x[j]² over j < n (n a multiple of 8), each square exact in float64 and summed in four float64 lanes per half.")
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	acc0, acc1 := YMM(), YMM()
	VXORPD(acc0, acc0, acc0)
	VXORPD(acc1, acc1, acc1)
	loop8("normSumSq", n, []reg.Register{x}, func() {
		t0, t1 := YMM(), YMM()
		VCVTPS2PD(Mem{Base: x}, t0)
		VCVTPS2PD(Mem{Base: x, Disp: 16}, t1)
		// A float32 square is exact in float64, so the fused add rounds
		// as a separate one would.
		VFMADD231PD(t0, t0, acc0)
		VFMADD231PD(t1, t1, acc1)
	})
	VADDPD(acc1, acc0, acc0)
	hsumPD(acc0)
	VZEROUPPER()
	Store(acc0.AsX(), ReturnIndex(0))
	RET()
}

func normScale() {
	TEXT("normScale", NOSPLIT, "func(y, x, w *float32, n int, r float32)")
	Pragma("noescape")
	Doc("normScale sets y[j] = w[j]·(x[j]·r) for j < n (n a multiple of 8).")
	y := Load(Param("y"), GP64())
	x := Load(Param("x"), GP64())
	w := Load(Param("w"), GP64())
	n := Load(Param("n"), GP64())
	r := bcastParam("r")
	loop8("normScale", n, []reg.Register{y, x, w}, func() {
		t := YMM()
		VMULPS(Mem{Base: x}, r, t)
		VMULPS(Mem{Base: w}, t, t)
		VMOVUPS(t, Mem{Base: y})
	})
	VZEROUPPER()
	RET()
}

func normDot() {
	TEXT("normDot", NOSPLIT, "func(dy, w, x *float32, n int, r float32) float64")
	Pragma("noescape")
	Doc("normDot returns Σ (dy[j]·w[j])·(x[j]·r) over j < n (n a multiple of 8), each term rounded to float32 and summed in float64 lanes.")
	dy := Load(Param("dy"), GP64())
	w := Load(Param("w"), GP64())
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	r := bcastParam("r")
	acc0, acc1 := YMM(), YMM()
	VXORPD(acc0, acc0, acc0)
	VXORPD(acc1, acc1, acc1)
	loop8("normDot", n, []reg.Register{dy, w, x}, func() {
		g, xh := YMM(), YMM()
		VMOVUPS(Mem{Base: dy}, g)
		VMULPS(Mem{Base: w}, g, g)
		VMULPS(Mem{Base: x}, r, xh)
		VMULPS(xh, g, g)
		lo, hi := YMM(), YMM()
		VCVTPS2PD(g.AsX(), lo)
		VEXTRACTF128(Imm(1), g, g.AsX())
		VCVTPS2PD(g.AsX(), hi)
		VADDPD(lo, acc0, acc0)
		VADDPD(hi, acc1, acc1)
	})
	VADDPD(acc1, acc0, acc0)
	hsumPD(acc0)
	VZEROUPPER()
	Store(acc0.AsX(), ReturnIndex(0))
	RET()
}

func normDx() {
	TEXT("normDx", NOSPLIT, "func(dx, dy, w, x *float32, n int, r, mean float32)")
	Pragma("noescape")
	Doc("normDx sets dx[j] += r·(dy[j]·w[j] − (x[j]·r)·mean) for j < n (n a multiple of 8).")
	dx := Load(Param("dx"), GP64())
	dy := Load(Param("dy"), GP64())
	w := Load(Param("w"), GP64())
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	r := bcastParam("r")
	mean := bcastParam("mean")
	loop8("normDx", n, []reg.Register{dx, dy, w, x}, func() {
		g, xh := YMM(), YMM()
		VMOVUPS(Mem{Base: dy}, g)
		VMULPS(Mem{Base: w}, g, g)
		VMULPS(Mem{Base: x}, r, xh)
		VMULPS(mean, xh, xh)
		VSUBPS(xh, g, g) // g − xh·mean
		VMULPS(r, g, g)
		VADDPS(Mem{Base: dx}, g, g)
		VMOVUPS(g, Mem{Base: dx})
	})
	VZEROUPPER()
	RET()
}

func normDw() {
	TEXT("normDw", NOSPLIT, "func(dw, dy, x *float32, n int, r float32)")
	Pragma("noescape")
	Doc("normDw sets dw[j] += dy[j]·(x[j]·r) for j < n (n a multiple of 8).")
	dw := Load(Param("dw"), GP64())
	dy := Load(Param("dy"), GP64())
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	r := bcastParam("r")
	loop8("normDw", n, []reg.Register{dw, dy, x}, func() {
		t := YMM()
		VMULPS(Mem{Base: x}, r, t)
		VMULPS(Mem{Base: dy}, t, t)
		VADDPS(Mem{Base: dw}, t, t)
		VMOVUPS(t, Mem{Base: dw})
	})
	VZEROUPPER()
	RET()
}
