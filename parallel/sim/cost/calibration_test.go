package cost

import (
	"math"
	"testing"

	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/hw"
)

func TestCalibrationValidate(t *testing.T) {
	for _, c := range []Calibration{{NVLinkEfficiency: 1.5}, {GEMMScale: -1}, {AllocatorOverhead: 1}, {NetEfficiency: math.NaN()}} {
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
