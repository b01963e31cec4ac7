package calib_test

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/moe"

	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/calib"
	"github.com/moescope/moescope/parallel/sim/published"
)

// Fit the model to a measured run of your own stack, then predict with it.
func ExampleCalibrate() {
	// torchtitan's Llama 3.1 8B on 8 H100 (96 GB), 2024-12 (R171 in
	// parallel/sim/validate/testdata/published): one run, so one overall compute scale.
	// The description starts from the schema's defaults (compiled,
	// torchtitan's recipe), as a runs file read by ReadRuns does.
	measured := published.Run{Model: "llama3-8b", GPU: "h100-96gb", Spec: published.Defaults(), Precision: "bf16", TPS: 6667}
	measured.GPUs, measured.DPShard, measured.DPReplicate, measured.EP = 8, 8, 1, 1
	measured.AC, measured.LBS, measured.Seq = moe.AC{Mode: moe.ACSelective}, 2, 8192
	cal, err := calib.Calibrate([]published.Run{measured})
	if err != nil {
		panic(err)
	}
	in, err := published.InputForRun(measured)
	if err != nil {
		panic(err)
	}
	in.Calibration = cal
	r, err := sim.Simulate(in)
	if err != nil {
		panic(err)
	}
	fmt.Printf("fitted %v; predicted TPS within 1%%: %v; interval given: %v\n", cal.Fitted[0], math.Abs(r.TPS/6667-1) < 0.01,
		r.TPSInterval != nil && r.TPSInterval[0] < r.TPS && r.TPS < r.TPSInterval[1])
	// Output: fitted compute_scale; predicted TPS within 1%: true; interval given: true
}
