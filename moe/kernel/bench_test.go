package kernel

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

var (
	peakOnce sync.Once
	peakVal  Peak
)

// benchPeak is the machine's peak for the active kernel, measured once.
func benchPeak() Peak {
	peakOnce.Do(func() { peakVal = MeasurePeak(0) })
	return peakVal
}

// reportGFLOPS reports GFLOP/s and the fraction of the per-core or all-core
// peak (percent) for flop FLOP per iteration on threads cores.
func reportGFLOPS(b *testing.B, flop float64, threads int) {
	p := benchPeak()
	gf := flop * float64(b.N) / b.Elapsed().Seconds() / 1e9
	peak := p.PerCoreGFLOPS
	if threads > 1 {
		peak = p.AllCoreGFLOPS * float64(threads) / float64(p.Threads)
	}
	b.ReportMetric(gf, "GFLOP/s")
	b.ReportMetric(100*gf/peak, "%peak")
}

func BenchmarkSgemm(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, threads := range []int{1, 2} {
		for _, n := range []int{256, 512, 1024, 2048} {
			for _, layout := range []struct {
				name   string
				ta, tb bool
			}{{"NN", false, false}, {"NT", false, true}, {"TN", true, false}} {
				b.Run(fmt.Sprintf("%s/%d/threads=%d", layout.name, n, threads), func(b *testing.B) {
					a, bb, c := randSlice(r, n*n), randSlice(r, n*n), make([]float32, n*n)
					prev := SetThreads(threads)
					defer SetThreads(prev)
					Sgemm(layout.ta, layout.tb, n, n, n, 1, a, n, bb, n, 0, c, n)
					for b.Loop() {
						Sgemm(layout.ta, layout.tb, n, n, n, 1, a, n, bb, n, 0, c, n)
					}
					reportGFLOPS(b, 2*float64(n)*float64(n)*float64(n), threads)
				})
			}
		}
	}
}
