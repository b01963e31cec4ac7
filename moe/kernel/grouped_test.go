package kernel

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestGrouped compares the grouped GEMMs with per-group sgemmRef calls,
// including empty groups.
func TestGrouped(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(4, 4))
		const n, k = 37, 70
		offsets := []int{0, 5, 5, 40, 41, 100, 100}
		E, T := len(offsets)-1, offsets[len(offsets)-1]
		w := make([][]float32, E)
		for e := range w {
			w[e] = randSlice(r, n*k)
		}
		x, dy := randSlice(r, T*k), randSlice(r, T*n)
		y := randSlice(r, T*n)
		GroupedLinear(y, x, w, offsets, n, k)
		dx := randSlice(r, T*k)
		wantDx := append([]float32(nil), dx...)
		GroupedLinearBackwardData(dx, dy, w, offsets, n, k)
		dw := make([][]float32, E)
		wantDw := make([][]float32, E)
		for e := range dw {
			dw[e] = randSlice(r, n*k)
			wantDw[e] = append([]float32(nil), dw[e]...)
		}
		GroupedLinearBackwardWeight(dw, dy, x, offsets, n, k)
		wantY := make([]float32, T*n)
		for e := 0; e < E; e++ {
			r0, m := offsets[e], offsets[e+1]-offsets[e]
			sgemmRef(false, true, m, n, k, 1, x[r0*k:], k, w[e], k, 0, wantY[r0*n:], n)
			sgemmRef(false, false, m, k, n, 1, dy[r0*n:], n, w[e], k, 1, wantDx[r0*k:], k)
			sgemmRef(true, false, n, k, m, 1, dy[r0*n:], n, x[r0*k:], k, 1, wantDw[e], k)
		}
		near := func(what string, got, want []float32) {
			for i := range want {
				if d := got[i] - want[i]; d > 1e-4 || d < -1e-4 {
					t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
				}
			}
		}
		near("y", y, wantY)
		near("dx", dx, wantDx)
		for e := range dw {
			near("dw", dw[e], wantDw[e])
		}
	})
}

func TestLargestFirst(t *testing.T) {
	// Rows per expert 2, 8, 0, 5, 8 (hand-read from the offsets): the
	// largest first, the two 8s in index order, the empty one last.
	got := largestFirst(make([]int, 0, 1), []int{0, 2, 10, 10, 15, 23})
	if want := []int{1, 4, 3, 0, 2}; !slices.Equal(got, want) {
		t.Fatalf("largestFirst = %v, want %v", got, want)
	}
}
