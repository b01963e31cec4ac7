package cost

import (
	"math"
	"testing"

	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
)

func TestCalibrationValidate(t *testing.T) {
	for _, c := range []Calibration{{NVLinkEfficiency: 1.5}, {GEMMScale: -1}, {AllocatorOverhead: 1}, {NetEfficiency: math.NaN()},
		{Residuals: []float64{0.01}, ResidualRuns: []string{"R1", "R2"}}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// FuzzParseCalibration: any document is rejected or gives a calibration
// that yields a valid compute spec and finite collective costs.
func FuzzParseCalibration(f *testing.F) {
	f.Add([]byte(`{"gemm_scale":0.8,"nvlink_efficiency":0.7,"allocator_overhead":0.1}`))
	f.Add([]byte(`{"net_efficiency":1,"fitted":["net_efficiency"],"residuals":[0.01]}`))
	f.Add([]byte(`{}`))
	dev, err := hw.LookupDevice("h100")
	if err != nil {
		f.Fatal(err)
	}
	hgx, err := hw.LoadCluster("hgx-h100")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCalibration(data, "fuzz")
		if err != nil {
			return
		}
		if err := ComputeSpecOf(dev).Calibrated(c).Validate(); err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		cc, err := Collective(hgx, c, parallel.CollAllReduce, GroupShape{16, 2, 8}, 1e9)
		if err != nil || !(cc.Seconds() > 0) || math.IsInf(cc.Seconds(), 0) {
			t.Fatalf("%+v: %+v %v", c, cc, err)
		}
	})
}

// TestCalibrationValueAndLogSD: every parameter name reads its own field,
// an unknown one is an error, and the spread is √ of the covariance's
// diagonal (0.0004 → 0.02, 0.01 → 0.1) only for the parameters it covers.
func TestCalibrationValueAndLogSD(t *testing.T) {
	c := Calibration{ComputeScale: 1.5, GEMMScale: 0.9, GroupedScale: 0.8, AttentionScale: 1.1, MemoryBoundScale: 0.7,
		NVLinkEfficiency: 0.6, NetEfficiency: 0.5, AllocatorOverhead: 0.1,
		CovarianceParams: []string{CalCompute, CalNet}, Covariance: [][]float64{{0.0004, 0.001}, {0.001, 0.01}}}
	for name, want := range map[string]float64{CalCompute: 1.5, CalGEMM: 0.9, CalGrouped: 0.8, CalAttention: 1.1, CalMemoryBound: 0.7,
		CalNVLink: 0.6, CalNet: 0.5, CalAllocator: 0.1} {
		if got, err := c.Value(name); err != nil || got != want {
			t.Errorf("Value(%s) = %v, %v; want %v", name, got, err, want)
		}
	}
	if _, err := c.Value("gemm"); err == nil {
		t.Error("Value of an unknown name: no error")
	}
	for name, want := range map[string]float64{CalCompute: 0.02, CalNet: 0.1} {
		if got, ok := c.LogSD(name); !ok || math.Abs(got-want) > 1e-12 {
			t.Errorf("LogSD(%s) = %v, %v; want %v", name, got, ok, want)
		}
	}
	for _, name := range []string{CalGEMM, CalAllocator} {
		if _, ok := c.LogSD(name); ok {
			t.Errorf("LogSD(%s): the covariance does not cover it", name)
		}
	}
}
