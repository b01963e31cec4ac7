package sim

import (
	"strings"
	"testing"
)

// TestCapacityFactor: Megatron-Core's token dropping, derived by hand for
// the tiny model (4 experts) on ep 4: capacity factor 0.5 keeps half of
// every balanced expert's rows, so the step is shorter than dropless; the
// skew-2 rank under factor 1.25 keeps 1.25 × the mean, between balanced and
// skew 2; padding to factor 1.25 makes a balanced step as slow as that;
// and counts sending every row to expert 0 under factor 1 leave it the
// mean (1024 rows, 256 per expert kept), as slow as balanced routing.
func TestCapacityFactor(t *testing.T) {
	step := func(edit func(*Input)) (float64, string) {
		in := simTestInput(t, "tiny", 8, 4, 4, 128, 1, "none")
		edit(&in)
		r, err := Simulate(in)
		if err != nil {
			t.Fatal(err)
		}
		return r.StepTimeS, r.Exactness
	}
	balanced, _ := step(func(*Input) {})
	half, note := step(func(in *Input) { in.CapacityFactor = 0.5 })
	skew2, _ := step(func(in *Input) { in.ExpertSkew = 2 })
	skewCapped, _ := step(func(in *Input) { in.ExpertSkew, in.CapacityFactor = 2, 1.25 })
	padded, _ := step(func(in *Input) { in.CapacityFactor, in.PadToCapacity = 1.25, true })
	counts, _ := step(func(in *Input) {
		in.ExpertCounts, in.CapacityFactor = [][]int64{{1024, 0, 0, 0}}, 1
	})
	if !(half < balanced) || !strings.Contains(note, "0.5× the mean rows, rows over capacity factor 0.5 dropped") {
		t.Errorf("factor 0.5: %g s (%q), dropless %g s", half, note, balanced)
	}
	if !(balanced < skewCapped && skewCapped < skew2) || skewCapped != padded {
		t.Errorf("skew 2 capped at 1.25: %g s; padded to 1.25: %g s; balanced %g s, skew 2 %g s", skewCapped, padded, balanced, skew2)
	}
	if counts != balanced {
		t.Errorf("counts all on expert 0 at factor 1: %g s, balanced %g s", counts, balanced)
	}
	in := simTestInput(t, "tiny", 8, 4, 4, 128, 1, "none")
	in.PadToCapacity = true
	if _, err := Simulate(in); err == nil || !strings.Contains(err.Error(), "pad_to_capacity") {
		t.Errorf("padding without a factor: %v", err)
	}
}
