package sim

import (
	"math"
	"testing"

	"github.com/moescope/moescope/internal/band"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// The slowest node, priced under a calibration (here one carrying only
// the stored spread, as calibrate writes it): a job on one host of 8 waits
// for no other node; on 4 hosts slowest_node is positive and with the
// other two clock overheads stays within what the tensor-core classes
// lose to the whole clock. Uncalibrated, or with the spread set to 0, it
// is absent and the job is faster.
func TestSlowestNodeOverhead(t *testing.T) {
	if band.Uncalibrated().NodeSpread == 0 {
		t.Skip("no stored spread between nodes")
	}
	dev, err := hw.LookupDevice("b200") // Simulate's default GPU, 8 per host
	if err != nil {
		t.Fatal(err)
	}
	for _, gpus := range []int{8, 32} {
		in := simTestInput(t, "qwen3-30b-a3b", gpus, 1, 2, 1024, 1, "selective")
		stored := band.Uncalibrated().NodeSpread
		in.Calibration = &cost.Calibration{NodeSpread: &stored}
		r, err := Simulate(in)
		if err != nil {
			t.Fatal(err)
		}
		node := r.Breakdown.OverheadS[OverheadSlowestNode]
		if (gpus == 8) != (node == 0) || node < 0 {
			t.Errorf("%d GPUs: slowest_node %g, want 0 on one host and > 0 on four", gpus, node)
		}
		spec := cost.ComputeSpecOf(dev)
		spec.GPUs, spec.Nodes, spec.NodeSpread = gpus, gpus/8, band.Uncalibrated().NodeSpread
		lost := (r.Breakdown.ComputeByClassS["gemm"] + r.Breakdown.ComputeByClassS["grouped_gemm"] +
			r.Breakdown.ComputeByClassS["attention"]) * (1 - spec.Clock())
		o := r.Breakdown.OverheadS
		if sum := o[OverheadSustainedClock] + o[OverheadSlowestGPU] + node; sum > lost*(1+1e-9) {
			t.Errorf("%d GPUs: clock overheads %g > what the clock loses, %g", gpus, sum, lost)
		}
		zero := 0.0
		for _, cal := range []*cost.Calibration{nil, {NodeSpread: &zero}} {
			in.Calibration = cal
			r0, err := Simulate(in)
			if err != nil {
				t.Fatal(err)
			}
			if r0.Breakdown.OverheadS[OverheadSlowestNode] != 0 || (gpus > 8) != (r0.TPS > r.TPS) {
				t.Errorf("%d GPUs, calibration %v: slowest_node %g, TPS %g against %g", gpus, cal, r0.Breakdown.OverheadS[OverheadSlowestNode], r0.TPS, r.TPS)
			}
		}
	}
}

// A calibrated interval widens beyond the nodes its runs spanned (the
// spread's uncertainty, band.Stored's NodeSpreadSD), and not within them.
func TestCalibratedIntervalBeyondItsNodes(t *testing.T) {
	if band.Uncalibrated().NodeSpreadSD == 0 {
		t.Skip("no stored uncertainty of the spread between nodes")
	}
	in := simTestInput(t, "qwen3-30b-a3b", 64, 1, 2, 1024, 1, "selective")
	width := func(maxNodes int) float64 {
		in.Calibration = &cost.Calibration{ComputeScale: 1, CovarianceParams: []string{cost.CalCompute},
			Covariance: [][]float64{{0.0004}}, ResidualSD: 0.02, MaxNodes: maxNodes}
		r, err := Simulate(in)
		if err != nil {
			t.Fatal(err)
		}
		return math.Log(r.TPSInterval[1] / r.TPSInterval[0])
	}
	at8, at1, at2 := width(8), width(1), width(2)
	if !(at1 > at2 && at2 > at8) {
		t.Errorf("interval widths (ln high/low) fitted on 1, 2, 8 hosts of the run's 8: %.4f, %.4f, %.4f; want decreasing", at1, at2, at8)
	}
	// Within its nodes the interval is the fit's alone: 2·1.645·√(g²·0.0004 + 0.02²) with g the
	// compute scale's sensitivity, at most 1: at most 2·1.645·√(0.0008) = 0.0930.
	if at8 > 0.0931 {
		t.Errorf("fitted on the run's own 8 hosts: width %.4f, want ≤ 0.0931 (no extrapolation)", at8)
	}
}
