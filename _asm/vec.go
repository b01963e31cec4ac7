package main

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// vecOps emits the AVX2+FMA row operations of the attention kernel. Each
// handles n elements, n a multiple of 8 (the Go caller does the tail).
func vecOps() {
	expConsts()
	expSubSum()
	rowMax()
	rowScale()
	rowDS()
	rowDot()
}

// Cephes expf (S. Moshier): exp(x) = 2^n·e^r, n = floor(x·log2e + ½),
// r = x − n·ln2 (ln2 split in two parts), e^r ≈ 1 + r + r²·P(r) with a
// degree-5 P; relative error about 1e-7 on [−87.3, 88.4].
var expTable = []float32{
	0:  1.44269504088896341, // log2e
	1:  0.5,
	2:  0.693359375,     // C1
	3:  -2.12194440e-4,  // C2
	4:  1.9875691500e-4, // p0
	5:  1.3981999507e-3,
	6:  8.3334519073e-3,
	7:  4.1665795894e-2,
	8:  1.6666665459e-1,
	9:  5.0000001201e-1,
	10: 1,
	11: 88.3762626647949,  // upper clamp
	12: -87.3365447505531, // below: exp is 0 (masked scores are −∞)
}

var expData Mem

func expConsts() {
	expData = GLOBL("expConsts", RODATA|NOPTR)
	for i, v := range expTable {
		for l := 0; l < 8; l++ {
			DATA(32*i+4*l, U32(math.Float32bits(v)))
		}
	}
}

func ec(i int) Mem { return expData.Offset(32 * i) }

// exp8 sets y = exp(x) for 8 lanes; x is clobbered.
func exp8(x, y reg.VecVirtual) {
	zero := YMM()
	VCMPPS(Imm(1), ec(12), x, zero) // zero = x < lo (ordered, less than)
	VMINPS(ec(11), x, x)
	fx := YMM()
	VMOVUPS(ec(1), fx)
	VFMADD231PS(ec(0), x, fx) // fx = x·log2e + ½
	VROUNDPS(Imm(1), fx, fx)  // floor
	VFNMADD231PS(ec(2), fx, x)
	VFNMADD231PS(ec(3), fx, x) // r
	VMOVUPS(ec(4), y)
	for i := 5; i <= 9; i++ {
		VFMADD213PS(ec(i), x, y) // y = y·r + p_i
	}
	z := YMM()
	VMULPS(x, x, z)
	VFMADD213PS(x, z, y) // y = y·r² + r
	VADDPS(ec(10), y, y) // + 1
	n := YMM()
	VCVTTPS2DQ(fx, n)
	VPSLLD(Imm(23), n, n)
	VPADDD(ec(10), n, n) // + bits of 1.0 = (n+127)<<23
	VMULPS(n, y, y)
	VANDNPS(y, zero, y) // 0 where x was below the range
}

func hsum(acc reg.VecVirtual) reg.VecVirtual {
	hi := XMM()
	VEXTRACTF128(Imm(1), acc, hi)
	lo := acc.AsX()
	VADDPS(hi, lo, lo)
	VHADDPS(lo, lo, lo)
	VHADDPS(lo, lo, lo)
	return acc
}

func expSubSum() {
	TEXT("expSubSum", NOSPLIT, "func(x *float32, n int, m float32) float32")
	Pragma("noescape")
	Doc("expSubSum sets x[j] = exp(x[j] − m) for j < n (n a multiple of 8; 0 where x[j] − m < −87.3) and returns their sum.")
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	m := YMM()
	VBROADCASTSS(NewParamAddr("m", 16), m)
	acc := YMM()
	VXORPS(acc, acc, acc)
	SHRQ(Imm(3), n)
	JZ(LabelRef("expSubSum_done"))
	Label("expSubSum_loop")
	v, y := YMM(), YMM()
	VMOVUPS(Mem{Base: x}, v)
	VSUBPS(m, v, v)
	exp8(v, y)
	VMOVUPS(y, Mem{Base: x})
	VADDPS(y, acc, acc)
	ADDQ(U8(32), x)
	DECQ(n)
	JNZ(LabelRef("expSubSum_loop"))
	Label("expSubSum_done")
	hsum(acc)
	VZEROUPPER()
	Store(acc.AsX(), ReturnIndex(0))
	RET()
}

func rowMax() {
	TEXT("rowMax", NOSPLIT, "func(x *float32, n int, m float32) float32")
	Pragma("noescape")
	Doc("rowMax returns the maximum of m and x[j], j < n (n a multiple of 8).")
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	acc := YMM()
	VBROADCASTSS(NewParamAddr("m", 16), acc)
	SHRQ(Imm(3), n)
	JZ(LabelRef("rowMax_done"))
	Label("rowMax_loop")
	VMAXPS(Mem{Base: x}, acc, acc)
	ADDQ(U8(32), x)
	DECQ(n)
	JNZ(LabelRef("rowMax_loop"))
	Label("rowMax_done")
	hi := XMM()
	VEXTRACTF128(Imm(1), acc, hi)
	lo := acc.AsX()
	VMAXPS(hi, lo, lo)
	VPERMILPS(Imm(0x4e), lo, hi)
	VMAXPS(hi, lo, lo)
	VPERMILPS(Imm(0xb1), lo, hi)
	VMAXPS(hi, lo, lo)
	VZEROUPPER()
	Store(lo, ReturnIndex(0))
	RET()
}

func rowScale() {
	TEXT("rowScale", NOSPLIT, "func(x *float32, n int, a float32)")
	Pragma("noescape")
	Doc("rowScale sets x[j] *= a for j < n (n a multiple of 8).")
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	a := YMM()
	VBROADCASTSS(NewParamAddr("a", 16), a)
	SHRQ(Imm(3), n)
	JZ(LabelRef("rowScale_done"))
	Label("rowScale_loop")
	v := YMM()
	VMULPS(Mem{Base: x}, a, v)
	VMOVUPS(v, Mem{Base: x})
	ADDQ(U8(32), x)
	DECQ(n)
	JNZ(LabelRef("rowScale_loop"))
	Label("rowScale_done")
	VZEROUPPER()
	RET()
}

func rowDS() {
	TEXT("rowDS", NOSPLIT, "func(ds, p *float32, n int, d, c float32)")
	Pragma("noescape")
	Doc("rowDS sets ds[j] = p[j]·(ds[j] − d)·c for j < n (n a multiple of 8).")
	ds := Load(Param("ds"), GP64())
	p := Load(Param("p"), GP64())
	n := Load(Param("n"), GP64())
	d, c := YMM(), YMM()
	VBROADCASTSS(NewParamAddr("d", 24), d)
	VBROADCASTSS(NewParamAddr("c", 28), c)
	SHRQ(Imm(3), n)
	JZ(LabelRef("rowDS_done"))
	Label("rowDS_loop")
	v, w := YMM(), YMM()
	VMOVUPS(Mem{Base: ds}, v)
	VSUBPS(d, v, v)
	VMULPS(Mem{Base: p}, c, w)
	VMULPS(w, v, v)
	VMOVUPS(v, Mem{Base: ds})
	ADDQ(U8(32), ds)
	ADDQ(U8(32), p)
	DECQ(n)
	JNZ(LabelRef("rowDS_loop"))
	Label("rowDS_done")
	VZEROUPPER()
	RET()
}

func rowDot() {
	TEXT("rowDot", NOSPLIT, "func(x, y *float32, n int) float32")
	Pragma("noescape")
	Doc("rowDot returns Σ x[j]·y[j] over j < n (n a multiple of 8).")
	x := Load(Param("x"), GP64())
	y := Load(Param("y"), GP64())
	n := Load(Param("n"), GP64())
	acc := YMM()
	VXORPS(acc, acc, acc)
	SHRQ(Imm(3), n)
	JZ(LabelRef("rowDot_done"))
	Label("rowDot_loop")
	v := YMM()
	VMOVUPS(Mem{Base: x}, v)
	VFMADD231PS(Mem{Base: y}, v, acc)
	ADDQ(U8(32), x)
	ADDQ(U8(32), y)
	DECQ(n)
	JNZ(LabelRef("rowDot_loop"))
	Label("rowDot_done")
	hsum(acc)
	VZEROUPPER()
	Store(acc.AsX(), ReturnIndex(0))
	RET()
}
