package kernel

import (
	"fmt"
	"slices"
)

// tuning is one microarchitecture's GEMM parameters: the micro-kernel and
// the rules that turn the cache sizes cpuid reports into blocking. Each
// row names the benchmark records (tuning_records.json) that set it. The
// prefetch distances belong to the generated micro-kernels (_asm/gemm.go)
// and are the same on every row: the records of both AVX-512 parts found
// the 12×32 kernel no faster with packed A prefetched.
type tuning struct {
	name   string
	vendor string   // cpuid's vendor string
	family int      // cpuid's family
	models []int    // cpuid's models of this microarchitecture; nil: the whole family
	kernel string   // the micro-kernel of the row's own parts (pickKernel)
	kcL1   [2]int   // kc is the largest whose kc×nr B sliver fills this fraction of L1
	rows   int      // tiles go by rows where half of L2 holds a B panel this wide (0: never)
	shared bool     // a row split packs one B panel shared by the cores (sharedB)
	record []string // the ids of the records in tuning_records.json that set this row; none for a row no one has measured
}

// tunings is the table, one row per microarchitecture the project has run
// on. A part not in it gets the nearest row (tuningFor).
var tunings = []tuning{
	// Zen 5 (family 0x1A): 12×32 AVX-512 tiles by columns with kc = 256
	// from 48 KiB of L1; row-split products run independent parts, each
	// core packing its own B panel (1.08–1.16× sharedB at 1024³ and 2048³
	// on two cores, record zen5-2026-12-03).
	{name: "zen5", vendor: "AuthenticAMD", family: 0x1A, kernel: "avx512", kcL1: [2]int{2, 3}, rows: 1024,
		record: []string{"zen5-2026-11-29", "zen5-2026-12-03"}},
	// Sapphire Rapids (family 6: 0x8F, Emerald Rapids 0xCF; the build
	// guest reported model 0xA7): the rows order and the shared B panel's
	// column order were measured on it (record spr-2026-12-01).
	{name: "sapphirerapids", vendor: "GenuineIntel", family: 6, models: []int{0x8F, 0xA7, 0xCF}, kernel: "avx512", kcL1: [2]int{2, 3}, rows: 1024, shared: true,
		record: []string{"spr-2026-12-01"}},
	// Zen 3 (family 0x19, models 0x00–0x0F, 0x20–0x2F, 0x40–0x5F): a kind
	// the project has been built on but never benchmarked: it keeps the
	// parameters in use before this table, with no record.
	{name: "zen3", vendor: "AuthenticAMD", family: 0x19, models: modelRange(0x00, 0x0F, 0x20, 0x2F, 0x40, 0x5F), kernel: "avx2", kcL1: [2]int{2, 3}, rows: 1024, shared: true},
}

// modelRange lists the models of inclusive ranges lo0, hi0, lo1, hi1, ….
func modelRange(bounds ...int) []int {
	var m []int
	for i := 0; i+1 < len(bounds); i += 2 {
		for x := bounds[i]; x <= bounds[i+1]; x++ {
			m = append(m, x)
		}
	}
	return m
}

// tuningFor returns the row of a part and whether it is the part's own. A
// part not in the table gets the row of its vendor nearest in family, then
// model; a vendor with no row, the first row whose kernel it supports
// (else the first row). Only a part's own row chooses its micro-kernel
// (pickKernel).
func tuningFor(vendor string, family, model int, supported []string) (tuning, bool) {
	for _, t := range tunings {
		if t.vendor == vendor && t.family == family && (t.models == nil || slices.Contains(t.models, model)) {
			return t, true
		}
	}
	best, bestDist := -1, 0
	for i, t := range tunings {
		if t.vendor != vendor {
			continue
		}
		d := 256*abs(t.family-family) + modelDistance(t.models, model)
		if best < 0 || d < bestDist {
			best, bestDist = i, d
		}
	}
	if best >= 0 {
		return tunings[best], false
	}
	for _, t := range tunings {
		if slices.Contains(supported, t.kernel) {
			return t, false
		}
	}
	return tunings[0], false
}

// modelDistance is how far model is from the nearest of models (0 for a
// whole family).
func modelDistance(models []int, model int) int {
	if len(models) == 0 {
		return 0
	}
	d := abs(models[0] - model)
	for _, m := range models[1:] {
		d = min(d, abs(m-model))
	}
	return d
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// tuningLabel names the row in use, and says so where it is only the
// nearest to this part.
func tuningLabel(t tuning, exact bool, vendor string, family, model int) string {
	if exact {
		return t.name
	}
	return fmt.Sprintf("%s (nearest row: %s family %d model %d is not in the table)", t.name, vendor, family, model)
}

// pickKernel is the micro-kernel for a part: its own row's where that is
// among ks, else the fastest of ks (a part only near a row was never
// measured with the row's kernel; the FMA loops say the fastest is the
// widest).
func pickKernel(t tuning, exact bool, ks []*microKernel) *microKernel {
	if exact {
		for _, k := range ks {
			if k.name == t.kernel {
				return k
			}
		}
	}
	return ks[0]
}
