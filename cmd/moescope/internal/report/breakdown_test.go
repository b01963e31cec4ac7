package report

import (
	"reflect"
	"testing"

	"github.com/moescope/moescope/parallel/sim"
)

func TestStepPartsOrder(t *testing.T) {
	b := sim.Breakdown{ComputeS: 3, RecomputeS: 2, OptimizerS: 1,
		ExposedCommS: map[string]float64{"reduce_scatter": 0.5, "all_gather": 0.25}}
	want := []StepPart{{"compute", 3}, {"recompute", 2}, {"optimizer", 1}, {"exposed all_gather", 0.25}, {"exposed reduce_scatter", 0.5}}
	if got := StepParts(b); !reflect.DeepEqual(got, want) {
		t.Errorf("StepParts = %v, want %v", got, want)
	}
}
