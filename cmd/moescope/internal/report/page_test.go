package report

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/parallel/sim/cost"
)

func TestCalibrationIntervalsNote(t *testing.T) {
	cal := &cost.Calibration{GEMMScale: 0.9, Fitted: []string{cost.CalGEMM}, CovarianceParams: []string{cost.CalGEMM},
		Covariance: [][]float64{{0.01}}, ResidualSD: 0.04, Residuals: []float64{0.01}}
	v := calibrationRows(cal)
	if !strings.Contains(v.Intervals, "over gemm_scale and a residual spread of 4.0% give each reported plan's TPS a 90% interval") {
		t.Errorf("intervals note %q", v.Intervals)
	}
	if v.Params[1][0] != cost.CalGEMM || v.Params[1][1] != "0.9" || v.Params[1][2] != "fitted" || v.Params[0][1] != "default" {
		t.Errorf("params %v", v.Params)
	}
	if got := intervalText(&[2]float64{31000.4, 35000.6}); got != "[31000, 35001]" {
		t.Errorf("intervalText = %q", got)
	}
}
