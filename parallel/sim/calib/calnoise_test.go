package calib

import (
	"math"
	"testing"

	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/cost"
	"github.com/moescope/moescope/parallel/sim/published"
)

// TestCalibrateOneRunUsesRunNoise: one Llama 3 8B run on one B200 (no
// communication, kernels far above the launch floor) measured 20% below
// its uncalibrated prediction (below, not above: a scale above 1 meets the
// efficiencies' cap and stops moving TPS). Its TPS is then proportional to
// the one compute scale, ∂ ln TPS/∂x = 1, and the fit weighs the run by
// σ = cost.RunTPSNoise = 2% against the prior's ln 2:
//
//	x   = ln 0.8 · (1/σ²) / (1/σ² + 1/ln²2) = −0.223144 · 2500/2502.0814 = −0.222958
//	θ   = e^x = 0.800149
//	var = 1/(2500 + 2.0814) = 3.99667e-4, sd of ln θ = 0.019992
//	residual = e^(x − ln 0.8) − 1 = +1.856e-4
//
// and with no degrees of freedom left the residual spread is σ itself.
func TestCalibrateOneRunUsesRunNoise(t *testing.T) {
	if cost.RunTPSNoise != 0.02 {
		t.Fatalf("cost.RunTPSNoise = %v: the hand derivation assumes 2%%", cost.RunTPSNoise)
	}
	r := published.Run{Model: "llama3-8b", GPU: "b200", Spec: testSpec(1, 1, 1, "selective", 2, 4096), Precision: "bf16", TPS: 1}
	in, err := published.InputForRun(r)
	if err != nil {
		t.Fatal(err)
	}
	res, err := sim.Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	r.TPS = 0.8 * res.TPS
	cal, err := Calibrate([]published.Run{r})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(cal.ComputeScale/0.800149-1) > 1e-4 {
		t.Errorf("compute_scale %.6f, want 0.800149", cal.ComputeScale)
	}
	if len(cal.Covariance) != 1 || math.Abs(cal.Covariance[0][0]/3.99667e-4-1) > 1e-3 {
		t.Errorf("covariance %v, want [[3.99667e-4]]", cal.Covariance)
	}
	if cal.ResidualSD != 0.02 {
		t.Errorf("residual_sd %v, want 0.02 (no degrees of freedom: σ)", cal.ResidualSD)
	}
	if len(cal.Residuals) != 1 || math.Abs(cal.Residuals[0]-1.856e-4) > 2e-5 {
		t.Errorf("residuals %v, want [1.856e-4]", cal.Residuals)
	}
}
