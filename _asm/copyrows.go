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
	for _, w := range []int{32, 16, 12, 4} {
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
	var x reg.VecVirtual
	if w%8 == 4 {
		x = XMM()
		VMOVUPS(Mem{Base: src, Disp: 4 * (w - 4)}, x)
	}
	for i, y := range regs {
		VMOVUPS(y, Mem{Base: dst, Disp: 4 * offs[i]})
	}
	if x != nil {
		VMOVUPS(x, Mem{Base: dst, Disp: 4 * (w - 4)})
	}
	ADDQ(ld, src)
	ADDQ(U32(4*w), dst)
	DECQ(kc)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}
