// Package kernel holds the float32 compute kernels of the reference
// implementation: GEMM in the layouts backward needs, the grouped expert GEMM
// and flash-style attention, with a plain-Go path kept as the test oracle.
package kernel
