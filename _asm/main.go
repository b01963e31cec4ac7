// Command _asm generates moe/kernel's amd64 assembly with avo. It lives in its
// own module so that users of moescope never depend on avo.
//
// Regenerate from this directory with
//
//	go run . -pkg kernel -out ../moe/kernel/kernel_amd64.s -stubs ../moe/kernel/kernel_amd64.go
package main

import (
	. "github.com/mmcloughlin/avo/build"
)

func main() {
	ConstraintExpr("!purego")
	peak()
	gemmKernels()
	transposes()
	vecOps()
	actOps()
	addOps()
	copyRowsKernels()
	normOps()
	Generate()
}
