package ref

import (
	"slices"
	"testing"

	"github.com/moescope/moescope/moe/moetest"
)

// TestProgress: Options.Progress is told after each block's forward and
// backward, counting to 2 × layers with a backward (ForwardBackward) and to
// layers without one (Evaluate): for TinyMoE's 2 layers, by hand, (1,4)
// (2,4) (3,4) (4,4) and (1,2) (2,2).
func TestProgress(t *testing.T) {
	m, err := NewModel[float32](moetest.TinyMoE())
	if err != nil {
		t.Fatal(err)
	}
	m.InitRandom(1)
	tokens := [][]int{{1, 2, 3, 4, 5}}
	var got [][2]int
	o := Options{Progress: func(done, total int) { got = append(got, [2]int{done, total}) }}
	if _, err := m.ForwardBackward(tokens, 1, o); err != nil {
		t.Fatal(err)
	}
	if want := [][2]int{{1, 4}, {2, 4}, {3, 4}, {4, 4}}; !slices.Equal(got, want) {
		t.Errorf("forward and backward: %v, want %v", got, want)
	}
	got = nil
	if _, err := m.Evaluate(tokens, o); err != nil {
		t.Fatal(err)
	}
	if want := [][2]int{{1, 2}, {2, 2}}; !slices.Equal(got, want) {
		t.Errorf("forward only: %v, want %v", got, want)
	}
}
