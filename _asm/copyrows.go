package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// copyRowsKernels emits the packing copies for the micro-kernel widths: kc
// rows of w contiguous floats, source rows ld apart, destination rows
// packed. A Go array copy of 128 bytes compiles to a memmove call, which
// cost a tenth of attention's backward.
func copyRowsKernels() {
	for _, w := range []int{32, 16, 12, 6, 4} {
		copyRows(w)
	}
}

func copyRows(w int) {
	name := fmt.Sprintf("copyRows%d", w)
	TEXT(name, NOSPLIT, "func(dst, src *float32, ld, kc int)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s sets dst[p·%d+j] = src[p·ld+j] for j < %d, p < kc.", name, w, w))
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	ld := Load(Param("ld"), GP64())
	kc := Load(Param("kc"), GP64())
	SHLQ(Imm(2), ld)
	TESTQ(kc, kc)
	JZ(LabelRef(name + "_done"))
	Label(name + "_loop")
	var regs []reg.VecVirtual
	var offs []int
	for off := 0; off+8 <= w; off += 8 {
		y := YMM()
		VMOVUPS(Mem{Base: src, Disp: 4 * off}, y)
		regs, offs = append(regs, y), append(offs, off)
	}
	rest := w % 8 // 4 or 6 left after the 8-float vectors
	var x reg.VecVirtual
	xOff := w - rest
	if rest >= 4 {
		x = XMM()
		VMOVUPS(Mem{Base: src, Disp: 4 * xOff}, x)
	}
	var q reg.GPVirtual
	if rest%4 == 2 { // the last two floats (AVX2's 6-row A slivers) as one 8-byte move
		q = GP64()
		MOVQ(Mem{Base: src, Disp: 4 * (w - 2)}, q)
	}
	for i, y := range regs {
		VMOVUPS(y, Mem{Base: dst, Disp: 4 * offs[i]})
	}
	if x != nil {
		VMOVUPS(x, Mem{Base: dst, Disp: 4 * xOff})
	}
	if q != nil {
		MOVQ(q, Mem{Base: dst, Disp: 4 * (w - 2)})
	}
	ADDQ(ld, src)
	ADDQ(U32(4*w), dst)
	DECQ(kc)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}
