package report

import (
	"strings"
	"testing"
)

func TestLinearTicks(t *testing.T) {
	var got []string
	for _, tk := range (linearTicks{}).Ticks(0, 29032.3) {
		if tk.Label != "" {
			got = append(got, tk.Label)
		}
	}
	// (29032.3 − 0)/6 = 4839 → a step of 5000.
	if want := "0 5000 10000 15000 20000 25000"; strings.Join(got, " ") != want {
		t.Errorf("labels %q, want %q", strings.Join(got, " "), want)
	}
	got = got[:0]
	for _, tk := range (linearTicks{}).Ticks(0, 1.3) {
		if tk.Label != "" {
			got = append(got, tk.Label)
		}
	}
	// 1.3/6 = 0.217 → 0.5.
	if want := "0 0.5 1"; strings.Join(got, " ") != want {
		t.Errorf("labels %q, want %q", strings.Join(got, " "), want)
	}
}
