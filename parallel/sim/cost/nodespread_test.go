package cost

import (
	"math"
	"strings"
	"testing"
)

// TestNodeSpreadLossHandWorked: E[max of 2 standard normals] = 1/√π and
// E[max of 3] = 3/(2√π) in closed form (the maximum of two is |X−Y|/2 above
// their mean; David & Nagaraja, Order Statistics, for three), so a spread
// of 2% between nodes costs 0.02/√π = 1.1284% on 2 nodes and 0.03/√π =
// 1.6926% on 3; one node, or no spread, costs nothing.
func TestNodeSpreadLossHandWorked(t *testing.T) {
	for _, c := range []struct {
		sd    float64
		nodes int
		want  float64
	}{{0.02, 2, 0.02 / math.Sqrt(math.Pi)}, {0.02, 3, 0.02 * 3 / (2 * math.Sqrt(math.Pi))}, {0.02, 1, 0}, {0.02, 0, 0}, {0, 64, 0}} {
		if got := NodeSpreadLoss(c.sd, c.nodes); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("NodeSpreadLoss(%v, %d) = %.9f, want %.9f", c.sd, c.nodes, got, c.want)
		}
	}
}

// TestClockWithNodeSpread: the clock is sustained × (1 − the slowest GPU's
// loss − the slowest node's), by hand on 2 GPUs of 2 nodes: 0.8 × (1 −
// (0.01 + 0.02)/√π) = 0.786459 (E[max of 2] = 1/√π).
func TestClockWithNodeSpread(t *testing.T) {
	c := ComputeSpec{Sustained: 0.8, SpeedSD: 0.01, GPUs: 2, NodeSpread: 0.02, Nodes: 2}
	want := 0.8 * (1 - 0.03/math.Sqrt(math.Pi))
	if got := c.Clock(); math.Abs(got-want) > 1e-12 {
		t.Errorf("Clock = %.9f, want %.9f", got, want)
	}
	c.Nodes = 1
	if got, want := c.Clock(), 0.8*(1-0.01/math.Sqrt(math.Pi)); math.Abs(got-want) > 1e-12 {
		t.Errorf("one node: Clock = %.9f, want %.9f (no node spread)", got, want)
	}
}

// TestCalibrationRefusesBadNodeSpread: a calibration's node spread is a
// spread in [0, hw.MaxSpeedSD = 5%], named when it is not.
func TestCalibrationRefusesBadNodeSpread(t *testing.T) {
	for _, v := range []float64{-0.01, 0.2, math.NaN()} {
		c := Calibration{NodeSpread: &v}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "node_spread") {
			t.Errorf("node_spread %v: error %v, want one naming node_spread", v, err)
		}
	}
	ok := 0.03
	if err := (&Calibration{NodeSpread: &ok, MaxNodes: 16}).Validate(); err != nil {
		t.Errorf("node_spread 0.03, max_nodes 16: %v", err)
	}
}
