package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// peak emits the register-only loops that measure the clock and the FMA
// throughput of one core.
func peak() {
	// fmaLoop: n iterations of `accs` independent vector FMAs. The
	// accumulators never depend on memory, so the loop runs at the FMA
	// pipes' throughput once accs ≥ latency × pipes (4 × 2 on Zen).
	fmaLoop := func(name string, accs int, vec func() reg.VecVirtual, flop int) {
		TEXT(name, NOSPLIT, "func(n int)")
		Doc(fmt.Sprintf("%s runs n iterations of %d independent vector FMAs (%d float32 FLOP per iteration) on registers only.", name, accs, accs*flop))
		n := Load(Param("n"), GP64())
		x, y := vec(), vec()
		VXORPS(x, x, x)
		VXORPS(y, y, y)
		acc := make([]reg.VecVirtual, accs)
		for i := range acc {
			acc[i] = vec()
			VXORPS(acc[i], acc[i], acc[i])
		}
		TESTQ(n, n)
		JZ(LabelRef(name + "_done"))
		Label(name + "_loop")
		for i := range acc {
			VFMADD231PS(x, y, acc[i])
		}
		DECQ(n)
		JNZ(LabelRef(name + "_loop"))
		Label(name + "_done")
		VZEROUPPER()
		RET()
	}
	fmaLoop("fmaLoopAVX2", 12, YMM, 16)
	fmaLoop("fmaLoopAVX512", 24, ZMM, 32)

	// Register-to-register adds: Intel's Golden Cove renamer folds chains of
	// add-immediate (an earlier `ADDQ $1` chain read 7.2 GHz on a Sapphire
	// Rapids core), a register doubling itself cannot be folded.
	TEXT("addChain", NOSPLIT, "func(n int) int")
	Doc("addChain runs n iterations of 16 dependent 1-cycle integer adds (s += s): 16·n core cycles.")
	n := Load(Param("n"), GP64())
	s := GP64()
	MOVQ(U32(1), s)
	TESTQ(n, n)
	JZ(LabelRef("addChain_done"))
	Label("addChain_loop")
	for i := 0; i < 16; i++ {
		ADDQ(s, s)
	}
	DECQ(n)
	JNZ(LabelRef("addChain_loop"))
	Label("addChain_done")
	Store(s, ReturnIndex(0))
	RET()
}
