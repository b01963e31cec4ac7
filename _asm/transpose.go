package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// transposes emits the block transposes the GEMM packing uses (AVX only,
// so both the AVX2 and the AVX-512 paths can call them).
func transposes() {
	transpose8()
	transpose4()
}

// transpose8: n consecutive 8×8 blocks. Block b reads rows r < 8 of src
// (row stride lds elements) at columns [8b, 8b+8) and writes column c as
// row 8b+c of dst (row stride ldd), 8 values, each times alpha.
func transpose8() {
	TEXT("transpose8", NOSPLIT, "func(dst *float32, ldd int, src *float32, lds int, n int, alpha float32)")
	Pragma("noescape")
	Doc("transpose8 writes dst[(8b+c)·ldd+r] = alpha·src[r·lds+8b+c] for r, c < 8, b < n.")
	dst := Load(Param("dst"), GP64())
	ldd := Load(Param("ldd"), GP64())
	src := Load(Param("src"), GP64())
	lds := Load(Param("lds"), GP64())
	n := Load(Param("n"), GP64())
	al := YMM()
	VBROADCASTSS(NewParamAddr("alpha", 40), al)
	SHLQ(Imm(2), ldd)
	SHLQ(Imm(2), lds)
	// Row pointers: src, src+lds, src+2lds, src+3lds, and the same from src+4lds.
	lds3 := GP64()
	LEAQ(Mem{Base: lds, Index: lds, Scale: 2}, lds3)
	src4 := GP64()
	LEAQ(Mem{Base: src, Index: lds, Scale: 4}, src4)
	ldd3 := GP64()
	LEAQ(Mem{Base: ldd, Index: ldd, Scale: 2}, ldd3)
	TESTQ(n, n)
	JZ(LabelRef("transpose8_done"))
	Label("transpose8_loop")
	r := make([]reg.VecVirtual, 8)
	for i := range r {
		r[i] = YMM()
	}
	rowAddr := func(i int) Mem {
		base := src
		if i >= 4 {
			base, i = src4, i-4
		}
		switch i {
		case 0:
			return Mem{Base: base}
		case 1:
			return Mem{Base: base, Index: lds, Scale: 1}
		case 2:
			return Mem{Base: base, Index: lds, Scale: 2}
		}
		return Mem{Base: base, Index: lds3, Scale: 1}
	}
	for i := range r {
		VMOVUPS(rowAddr(i), r[i])
	}
	t := make([]reg.VecVirtual, 8)
	for i := range t {
		t[i] = YMM()
	}
	for h := 0; h < 8; h += 4 {
		VUNPCKLPS(r[h+1], r[h], t[h])
		VUNPCKHPS(r[h+1], r[h], t[h+1])
		VUNPCKLPS(r[h+3], r[h+2], t[h+2])
		VUNPCKHPS(r[h+3], r[h+2], t[h+3])
	}
	u := r // reuse
	for h := 0; h < 8; h += 4 {
		VUNPCKLPD(t[h+2], t[h], u[h])     // col 0 | col 4
		VUNPCKHPD(t[h+2], t[h], u[h+1])   // col 1 | col 5
		VUNPCKLPD(t[h+3], t[h+1], u[h+2]) // col 2 | col 6
		VUNPCKHPD(t[h+3], t[h+1], u[h+3]) // col 3 | col 7
	}
	out := t // reuse
	for c := 0; c < 4; c++ {
		VPERM2F128(Imm(0x20), u[c+4], u[c], out[c])   // column c: rows 0-3 | rows 4-7
		VPERM2F128(Imm(0x31), u[c+4], u[c], out[c+4]) // column c+4
	}
	d := GP64()
	MOVQ(dst, d)
	for c := 0; c < 8; c++ {
		VMULPS(al, out[c], out[c])
		if c == 4 {
			LEAQ(Mem{Base: dst, Index: ldd, Scale: 4}, d)
		}
		switch c % 4 {
		case 0:
			VMOVUPS(out[c], Mem{Base: d})
		case 1:
			VMOVUPS(out[c], Mem{Base: d, Index: ldd, Scale: 1})
		case 2:
			VMOVUPS(out[c], Mem{Base: d, Index: ldd, Scale: 2})
		case 3:
			VMOVUPS(out[c], Mem{Base: d, Index: ldd3, Scale: 1})
		}
	}
	ADDQ(U8(32), src)
	ADDQ(U8(32), src4)
	LEAQ(Mem{Base: dst, Index: ldd, Scale: 8}, dst)
	DECQ(n)
	JNZ(LabelRef("transpose8_loop"))
	Label("transpose8_done")
	VZEROUPPER()
	RET()
}

// transpose4: n consecutive 4×8 blocks. Block b reads rows r < 4 of src at
// columns [8b, 8b+8) and writes column c as row 8b+c of dst, 4 values, each
// times alpha.
func transpose4() {
	TEXT("transpose4", NOSPLIT, "func(dst *float32, ldd int, src *float32, lds int, n int, alpha float32)")
	Pragma("noescape")
	Doc("transpose4 writes dst[(8b+c)·ldd+r] = alpha·src[r·lds+8b+c] for r < 4, c < 8, b < n.")
	dst := Load(Param("dst"), GP64())
	ldd := Load(Param("ldd"), GP64())
	src := Load(Param("src"), GP64())
	lds := Load(Param("lds"), GP64())
	n := Load(Param("n"), GP64())
	al := YMM()
	VBROADCASTSS(NewParamAddr("alpha", 40), al)
	SHLQ(Imm(2), ldd)
	SHLQ(Imm(2), lds)
	lds3 := GP64()
	LEAQ(Mem{Base: lds, Index: lds, Scale: 2}, lds3)
	ldd3 := GP64()
	LEAQ(Mem{Base: ldd, Index: ldd, Scale: 2}, ldd3)
	TESTQ(n, n)
	JZ(LabelRef("transpose4_done"))
	Label("transpose4_loop")
	r := make([]reg.VecVirtual, 4)
	for i := range r {
		r[i] = YMM()
	}
	VMOVUPS(Mem{Base: src}, r[0])
	VMOVUPS(Mem{Base: src, Index: lds, Scale: 1}, r[1])
	VMOVUPS(Mem{Base: src, Index: lds, Scale: 2}, r[2])
	VMOVUPS(Mem{Base: src, Index: lds3, Scale: 1}, r[3])
	t := make([]reg.VecVirtual, 4)
	for i := range t {
		t[i] = YMM()
	}
	VUNPCKLPS(r[1], r[0], t[0])
	VUNPCKHPS(r[1], r[0], t[1])
	VUNPCKLPS(r[3], r[2], t[2])
	VUNPCKHPS(r[3], r[2], t[3])
	VUNPCKLPD(t[2], t[0], r[0]) // col 0 | col 4
	VUNPCKHPD(t[2], t[0], r[1]) // col 1 | col 5
	VUNPCKLPD(t[3], t[1], r[2]) // col 2 | col 6
	VUNPCKHPD(t[3], t[1], r[3]) // col 3 | col 7
	d := GP64()
	MOVQ(dst, d)
	for c := 0; c < 4; c++ {
		VMULPS(al, r[c], r[c])
	}
	store := func(c int, x Op) {
		switch c % 4 {
		case 0:
			VMOVUPS(x, Mem{Base: d})
		case 1:
			VMOVUPS(x, Mem{Base: d, Index: ldd, Scale: 1})
		case 2:
			VMOVUPS(x, Mem{Base: d, Index: ldd, Scale: 2})
		case 3:
			VMOVUPS(x, Mem{Base: d, Index: ldd3, Scale: 1})
		}
	}
	for c := 0; c < 4; c++ {
		store(c, r[c].AsX())
	}
	LEAQ(Mem{Base: dst, Index: ldd, Scale: 4}, d)
	hi := XMM()
	for c := 0; c < 4; c++ {
		VEXTRACTF128(Imm(1), r[c], hi)
		store(c, hi)
	}
	ADDQ(U8(32), src)
	LEAQ(Mem{Base: dst, Index: ldd, Scale: 8}, dst)
	DECQ(n)
	JNZ(LabelRef("transpose4_loop"))
	Label("transpose4_done")
	VZEROUPPER()
	RET()
}
