// Package stats holds the order statistics the models share: the expected
// largest of n normal draws, which both the slowest node of a job
// (parallel/sim/cost) and the most loaded expert-parallel rank of a
// learned router (moe/job) are priced by.
package stats

import (
	"math"
	"sync"

	"gonum.org/v1/gonum/integrate/quad"
)

// ExpectedMaxNormal is E[max of n independent standard normals],
// ∫ x·n·φ(x)·Φ(x)^(n−1) dx, by Gauss–Legendre quadrature on [−12, 12]
// (what lies beyond is below n·φ(12) < 1e-25 for n up to job.MaxDegree);
// memoized, as every simulation of a layout asks for its world size.
func ExpectedMaxNormal(n int) float64 {
	if n <= 1 {
		return 0
	}
	maxNormalMu.Lock()
	defer maxNormalMu.Unlock()
	if v, ok := maxNormal[n]; ok {
		return v
	}
	m := float64(n)
	f := func(x float64) float64 {
		logCDF := math.Log(0.5 * math.Erfc(-x/math.Sqrt2))
		return x * m * math.Exp(-x*x/2+(m-1)*logCDF) / math.Sqrt(2*math.Pi)
	}
	v := quad.Fixed(f, -12, 12, 2000, nil, 0)
	maxNormal[n] = v
	return v
}

var (
	maxNormalMu sync.Mutex
	maxNormal   = map[int]float64{}
)
