package kernel

import (
	"os"
	"sync/atomic"

	"github.com/klauspost/cpuid/v2"
)

// microKernel is one implementation of the GEMM inner tile and of the FMA
// loop that measures the peak it can reach.
type microKernel struct {
	name   string
	mr, nr int // tile rows and columns
	// tile computes c[i·ldc+j] (+)= Σ_p a[p·mr+i]·b[p·nr+j] for i<mr, j<nr,
	// p<kc, overwriting when accumulate is false.
	tile func(kc int, a, b, c []float32, ldc int, accumulate bool)
	// fmaLoop runs n iterations of loopFLOP float32 FLOP on registers only.
	fmaLoop  func(n int)
	loopFLOP int
}

// kernels lists the usable micro-kernels, fastest first; the generic one is
// always last. Filled in init by the architecture files.
var kernels = []*microKernel{genericKernel}

// tune is this part's row of the tuning table and tuneExact whether it is
// the part's own (tuning.go); tests switch rows.
var (
	tune      tuning
	tuneExact bool
)

// current is the kernel in use; tests switch it with useKernel.
var current atomic.Pointer[microKernel]

func init() {
	kernels = append(archKernels(), kernels...)
	c := cpuid.CPU
	tune, tuneExact = tuningFor(c.VendorString, c.Family, c.Model, KernelNames())
	k := pickKernel(tune, tuneExact, kernels)
	// MOESCOPE_KERNEL=avx2|generic forces a slower path, to compare paths
	// on one machine; an unknown or unsupported name is ignored.
	if want := os.Getenv("MOESCOPE_KERNEL"); want != "" {
		for _, c := range kernels {
			if c.name == want {
				k = c
			}
		}
	}
	current.Store(k)
}

func active() *microKernel { return current.Load() }

// KernelNames lists the micro-kernels this build can run on this CPU,
// fastest first.
func KernelNames() []string {
	var s []string
	for _, k := range kernels {
		s = append(s, k.name)
	}
	return s
}

// UseKernel switches every kernel of the package to the named micro-kernel
// (one of KernelNames) and returns a function restoring the previous one.
// It exists for tests and benchmarks that compare the paths on one machine;
// it must not be called while kernels run. An unknown name returns false.
func UseKernel(name string) (restore func(), ok bool) {
	prev := current.Load()
	for _, k := range kernels {
		if k.name == name {
			current.Store(k)
			return func() { current.Store(prev) }, true
		}
	}
	return func() {}, false
}
