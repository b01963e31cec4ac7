package validate

import (
	"math"
	"testing"
)

// TestSpearman: rank correlations worked by hand.
//   - [1 2 3 4] against [1 3 2 4]: no ties, d = 0, −1, 1, 0, so
//     ρ = 1 − 6·Σd²/(n(n²−1)) = 1 − 6·2/60 = 0.8.
//   - [1 2 3 4 5] against [5 6 7 8 7]: the 7s share ranks 3 and 4 (3.5),
//     ranks of y 1, 2, 3.5, 5, 3.5; about the mean 3, Σdx·dy = 4+1+0+2+1 = 8,
//     Σdx² = 10, Σdy² = 4+1+0.25+4+0.25 = 9.5: ρ = 8/√95 = 0.820783.
//   - reversed order: −1; a constant side: NaN.
func TestSpearman(t *testing.T) {
	for _, c := range []struct {
		x, y []float64
		want float64
	}{
		{[]float64{1, 2, 3, 4}, []float64{1, 3, 2, 4}, 0.8},
		{[]float64{1, 2, 3, 4, 5}, []float64{5, 6, 7, 8, 7}, 8 / math.Sqrt(95)},
		{[]float64{10, 20, 30}, []float64{3, 2, 1}, -1},
	} {
		if got := Spearman(c.x, c.y); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Spearman(%v, %v) = %v, want %v", c.x, c.y, got, c.want)
		}
	}
	if got := Spearman([]float64{1, 2, 3}, []float64{4, 4, 4}); !math.IsNaN(got) {
		t.Errorf("constant y: %v, want NaN", got)
	}
}
