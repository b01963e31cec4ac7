package report

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/internal/fileio"
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

// TestCheckPlots: a directory still to be made under an existing one
// passes; one under a file is refused naming the file; a plot file already
// there is refused without force only.
func TestCheckPlots(t *testing.T) {
	dir := t.TempDir()
	if err := CheckPlots(filepath.Join(dir, "a", "b"), false); err != nil {
		t.Errorf("new directory: %v", err)
	}
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckPlots(filepath.Join(file, "plots"), true); err == nil || !strings.Contains(err.Error(), file+" is not a directory") {
		t.Errorf("under a file: %v", err)
	}
	if err := os.WriteFile(PlotPaths(dir)[0], nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckPlots(dir, false); !errors.Is(err, fileio.ErrExists) {
		t.Errorf("existing plot without --force: %v", err)
	}
	if err := CheckPlots(dir, true); err != nil {
		t.Errorf("existing plot with --force: %v", err)
	}
}
