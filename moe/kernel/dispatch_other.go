//go:build purego || !amd64

package kernel

// archKernels: this build has no assembly kernels.
func archKernels() []*microKernel { return nil }

// measureClock: unknown without assembly.
func measureClock() float64 { return 0 }

// useAsmRows: no assembly row operations in this build.
func useAsmRows(bool) {}
