// Package band holds the uncalibrated model's error bands: from the
// spread of moescope's errors over the published runs, the factors by
// which a measured TPS and a measured peak reserved memory lie from the
// prediction for 90% of runs. Package sim turns them into the 90%
// interval every uncalibrated prediction carries (DESIGN's Uncertainty
// contract); package validate computes them from the published-runs
// tables and checks the stored copy (bands.json) against its own.
package band

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"sync"
)

// Band is a 90% band of measured ÷ predicted: the measured value of 90%
// of runs lay within [Low, High] × the prediction.
type Band struct {
	Low  float64 `json:"low"`
	High float64 `json:"high"`
}

// Of is the interval [Low·v, High·v] of a predicted v.
func (b Band) Of(v float64) [2]float64 { return [2]float64{b.Low * v, b.High * v} }

// Inverse is the band of a quantity inversely proportional to the one
// the band is of (step time, of TPS).
func (b Band) Inverse() Band { return Band{1 / b.High, 1 / b.Low} }

// Stored is the bands of one generation with their provenance.
type Stored struct {
	About string `json:"about"`
	// TPS is the band of the uncalibrated TPS; TPSGroup says which runs it
	// is fitted to ("torchtitan": the runs of the framework moescope
	// models; "pooled": every run, when those are too few).
	TPS      Band   `json:"tps"`
	TPSGroup string `json:"tps_group"`
	TPSRuns  int    `json:"tps_runs"`
	// Memory is the band of the peak reserved memory, over every run with
	// a measured peak.
	Memory     Band `json:"memory"`
	MemoryRuns int  `json:"memory_runs"`
	Series     int  `json:"series"` // series the TPS band's runs come from
	// Coverage is the leave-one-series-out share of runs whose measured
	// value lay in the band fitted without their series.
	TPSCoverage    float64 `json:"tps_coverage"`
	MemoryCoverage float64 `json:"memory_coverage"`
	// NodeSpread is the scale-out fit (parallel/sim/validate's
	// ScaleOut): the relative spread of node speeds across a job beyond
	// one node's, the median of the estimates of NodeSpreadSources
	// independent sources of published scaling series (0 with fewer than
	// three), and NodeSpreadSD the standard deviation of those estimates,
	// the uncertainty a prediction at more nodes than its calibration's
	// carries.
	NodeSpread        float64 `json:"node_spread"`
	NodeSpreadSD      float64 `json:"node_spread_sd"`
	NodeSpreadSources int     `json:"node_spread_sources"`
	// RouterCV is the learned-routing fit (parallel/sim/validate's
	// Routing): the relative standard deviation of one routed expert's
	// load under a learned router beyond the sampling of its tokens, the
	// mean of the estimates of RouterCVSources published sources that
	// measured a router against forced balance (0: none), RouterCVSD their
	// standard deviation.
	RouterCV        float64 `json:"router_cv"`
	RouterCVSD      float64 `json:"router_cv_sd"`
	RouterCVSources int     `json:"router_cv_sources"`
}

//go:embed bands.json
var stored []byte

// Uncalibrated returns the stored bands.
func Uncalibrated() Stored { return uncalibrated() }

var uncalibrated = sync.OnceValue(func() Stored {
	var s Stored
	if err := json.Unmarshal(stored, &s); err != nil {
		panic(fmt.Sprintf("band: bands.json: %v", err)) // embedded at build time: a test reads it
	}
	return s
})

// Quantile is the q-quantile of sorted values by linear interpolation
// between order statistics (Hyndman–Fan type 7, R's and NumPy's default).
func Quantile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	h := q * float64(n-1)
	lo := int(math.Floor(h))
	if lo >= n-1 {
		return sorted[n-1]
	}
	return sorted[lo] + (h-float64(lo))*(sorted[lo+1]-sorted[lo])
}
