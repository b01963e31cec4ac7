package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// actOps emits the AVX2+FMA SwiGLU activations of the reference model
// (moe/kernel/elementwise.go). Each handles n elements, n a multiple of 8
// (the Go caller does the tail). The Go assembler reserves the name g, hence
// gate and up. Every product is rounded as the plain Go
// loop rounds it (no fused multiply-add), so the only difference from the
// Go path is σ: exp8's Cephes expf against float64 math.Exp.
func actOps() {
	swigluFwd()
	swigluBwd()
}

// sigmoid8 sets s = 1/(1 + exp(−g)) for 8 lanes; g is kept. exp8 clamps
// its argument to float32's range, so σ stays in (0, 1] without NaN or ∞.
func sigmoid8(g, s reg.VecVirtual) {
	t := YMM()
	VXORPS(t, t, t)
	VSUBPS(g, t, t) // t = −g
	e := YMM()
	exp8(t, e)
	VADDPS(ec(10), e, e) // 1 + e^−g
	VMOVUPS(ec(10), s)
	VDIVPS(e, s, s)
}

func swigluFwd() {
	TEXT("swigluFwd", NOSPLIT, "func(sg, a, gate, up *float32, n int)")
	Pragma("noescape")
	Doc("swigluFwd sets sg[j] = gate[j]·σ(gate[j]) and a[j] = sg[j]·up[j] for j < n (n a multiple of 8).")
	sg := Load(Param("sg"), GP64())
	a := Load(Param("a"), GP64())
	g := Load(Param("gate"), GP64())
	u := Load(Param("up"), GP64())
	n := Load(Param("n"), GP64())
	SHRQ(Imm(3), n)
	JZ(LabelRef("swigluFwd_done"))
	Label("swigluFwd_loop")
	gv, s := YMM(), YMM()
	VMOVUPS(Mem{Base: g}, gv)
	sigmoid8(gv, s)
	VMULPS(s, gv, s) // sg
	VMOVUPS(s, Mem{Base: sg})
	VMULPS(Mem{Base: u}, s, s) // a
	VMOVUPS(s, Mem{Base: a})
	for _, p := range []reg.Register{sg, a, g, u} {
		ADDQ(U8(32), p)
	}
	DECQ(n)
	JNZ(LabelRef("swigluFwd_loop"))
	Label("swigluFwd_done")
	VZEROUPPER()
	RET()
}

func swigluBwd() {
	TEXT("swigluBwd", NOSPLIT, "func(dg, du, da, gate, sg, up *float32, n int)")
	Pragma("noescape")
	Doc("swigluBwd sets du[j] = da[j]·sg[j] and dg[j] = da[j]·up[j]·σ(gate[j])·(1 + gate[j]·(1 − σ(gate[j]))) for j < n (n a multiple of 8).")
	dg := Load(Param("dg"), GP64())
	du := Load(Param("du"), GP64())
	da := Load(Param("da"), GP64())
	g := Load(Param("gate"), GP64())
	sg := Load(Param("sg"), GP64())
	u := Load(Param("up"), GP64())
	n := Load(Param("n"), GP64())
	SHRQ(Imm(3), n)
	JZ(LabelRef("swigluBwd_done"))
	Label("swigluBwd_loop")
	gv, s, d := YMM(), YMM(), YMM()
	VMOVUPS(Mem{Base: g}, gv)
	VMOVUPS(Mem{Base: da}, d)
	sigmoid8(gv, s)
	t := YMM()
	VMULPS(Mem{Base: sg}, d, t)
	VMOVUPS(t, Mem{Base: du})
	VMULPS(Mem{Base: u}, d, d) // da·u
	VMULPS(s, d, d)            // ·σ
	om := YMM()
	VMOVUPS(ec(10), om)
	VSUBPS(s, om, om)      // 1 − σ
	VMULPS(om, gv, om)     // g·(1 − σ)
	VADDPS(ec(10), om, om) // 1 + g·(1 − σ)
	VMULPS(om, d, d)
	VMOVUPS(d, Mem{Base: dg})
	for _, p := range []reg.Register{dg, du, da, g, sg, u} {
		ADDQ(U8(32), p)
	}
	DECQ(n)
	JNZ(LabelRef("swigluBwd_loop"))
	Label("swigluBwd_done")
	VZEROUPPER()
	RET()
}

// addOps emits the element-wise sum and scaled sum of the reference's
// residual adds, combine and dispatch backward: exact IEEE adds and
// multiplies, bit for bit what the Go loops compute.
func addOps() {
	TEXT("sumRow", NOSPLIT, "func(dst, a, b *float32, n int)")
	Pragma("noescape")
	Doc("sumRow sets dst[j] = a[j] + b[j] for j < n (n a multiple of 8).")
	dst := Load(Param("dst"), GP64())
	a := Load(Param("a"), GP64())
	b := Load(Param("b"), GP64())
	n := Load(Param("n"), GP64())
	SHRQ(Imm(3), n)
	JZ(LabelRef("sumRow_done"))
	Label("sumRow_loop")
	v := YMM()
	VMOVUPS(Mem{Base: a}, v)
	VADDPS(Mem{Base: b}, v, v)
	VMOVUPS(v, Mem{Base: dst})
	for _, p := range []reg.Register{dst, a, b} {
		ADDQ(U8(32), p)
	}
	DECQ(n)
	JNZ(LabelRef("sumRow_loop"))
	Label("sumRow_done")
	VZEROUPPER()
	RET()

	TEXT("axpyRow", NOSPLIT, "func(y, x *float32, n int, alpha float32)")
	Pragma("noescape")
	Doc("axpyRow sets y[j] += alpha·x[j] for j < n (n a multiple of 8), the product rounded before the add.")
	y := Load(Param("y"), GP64())
	x := Load(Param("x"), GP64())
	m := Load(Param("n"), GP64())
	al := YMM()
	VBROADCASTSS(NewParamAddr("alpha", 24), al)
	SHRQ(Imm(3), m)
	JZ(LabelRef("axpyRow_done"))
	Label("axpyRow_loop")
	w := YMM()
	VMULPS(Mem{Base: x}, al, w)
	VADDPS(Mem{Base: y}, w, w)
	VMOVUPS(w, Mem{Base: y})
	ADDQ(U8(32), y)
	ADDQ(U8(32), x)
	DECQ(m)
	JNZ(LabelRef("axpyRow_loop"))
	Label("axpyRow_done")
	VZEROUPPER()
	RET()
}
