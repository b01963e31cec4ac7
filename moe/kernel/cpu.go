package kernel

import (
	"runtime"

	"github.com/klauspost/cpuid/v2"
)

// CPU is what cpuid reports about the processor, plus the logical CPUs this
// process may run on and the micro-kernel this package dispatches to on it.
// cpuid's core counts are the package's (a VM may report its host's), not
// what the process can use: UsableCPUs is runtime.NumCPU, which honours the
// process's CPU affinity mask.
type CPU struct {
	Brand         string   `json:"brand"`
	Vendor        string   `json:"vendor"`
	Family        int      `json:"family"`
	Model         int      `json:"model"`
	UsableCPUs    int      `json:"usable_cpus"`
	PhysicalCores int      `json:"physical_cores"`
	LogicalCores  int      `json:"logical_cores"`
	Features      []string `json:"features"`  // the vector features the kernels can use, as cpuid names them
	L1DBytes      int      `json:"l1d_bytes"` // per core; -1 when cpuid does not say
	L2Bytes       int      `json:"l2_bytes"`  // per core; -1 when cpuid does not say
	L3Bytes       int      `json:"l3_bytes"`  // per CCX or package; -1 when cpuid does not say
	CacheLine     int      `json:"cache_line"`
	Kernel        string   `json:"kernel"` // the GEMM micro-kernel in use: "avx512", "avx2" or "generic"
	// Tuning is the row of the tuning table (tuning.go) the kernels use,
	// with "nearest row" where this part is not in the table.
	Tuning string `json:"tuning"`
}

// Info returns what cpuid reports, the CPUs this process may use and the
// kernel in use.
func Info() CPU {
	c := cpuid.CPU
	var feats []string
	for _, f := range []cpuid.FeatureID{cpuid.SSE2, cpuid.AVX, cpuid.AVX2, cpuid.FMA3, cpuid.AVX512F, cpuid.AVX512VL, cpuid.AVX512BF16} {
		if c.Supports(f) {
			feats = append(feats, f.String())
		}
	}
	return CPU{
		Brand:         c.BrandName,
		Vendor:        c.VendorString,
		Family:        c.Family,
		Model:         c.Model,
		UsableCPUs:    runtime.NumCPU(),
		PhysicalCores: c.PhysicalCores,
		LogicalCores:  c.LogicalCores,
		Features:      feats,
		L1DBytes:      c.Cache.L1D,
		L2Bytes:       c.Cache.L2,
		L3Bytes:       c.Cache.L3,
		CacheLine:     c.CacheLine,
		Kernel:        active().name,
		Tuning:        tuningLabel(tune, tuneExact, c.VendorString, c.Family, c.Model),
	}
}

// cacheL1 and cacheL2 are the per-core data cache sizes in bytes the
// blocking uses: cpuid's figures, or 32 KiB and 512 KiB when it reports none.
var cacheL1, cacheL2 = cacheOr(cpuid.CPU.Cache.L1D, 32<<10), cacheOr(cpuid.CPU.Cache.L2, 512<<10)

func cacheOr(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}
