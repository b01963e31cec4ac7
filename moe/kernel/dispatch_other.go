//go:build purego || !amd64

package kernel

// archKernels: this build has no assembly kernels.
func archKernels() []*microKernel { return nil }

// measureClock: unknown without assembly.
func measureClock() float64 { return 0 }
