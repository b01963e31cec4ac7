package stats

import (
	"math"
	"testing"
)

// E[max of n standard normals]: n = 2 and 3 in closed form (1/√π and
// 3/(2√π), from max(X, Y) = (X + Y + |X − Y|)/2 and the order-statistic
// integral), n = 5, 10, 100 from H. L. Harter's table of expected normal
// order statistics (Biometrika 48, 1961: 1.16296, 1.53875, 2.50759).
func TestExpectedMaxNormal(t *testing.T) {
	for _, c := range []struct {
		n    int
		want float64
	}{{1, 0}, {2, 1 / math.Sqrt(math.Pi)}, {3, 3 / (2 * math.Sqrt(math.Pi))}, {5, 1.16296}, {10, 1.53875}, {100, 2.50759}} {
		if got := ExpectedMaxNormal(c.n); math.Abs(got-c.want) > 1e-5 {
			t.Errorf("n = %d: %.6f, want %.6f", c.n, got, c.want)
		}
	}
	// The largest world a layout allows: finite and past the n = 100 value.
	if got := ExpectedMaxNormal(1 << 20); !(got > 4.5 && got < 5.5) {
		t.Errorf("n = 2^20: %v, want about √(2 ln n) − (ln ln n + ln 4π)/(2√(2 ln n)) ≈ 4.9", got)
	}
}
