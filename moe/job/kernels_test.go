package job

import (
	"strings"
	"testing"
)

// TestParseTorchVersion: releases read by hand; a bad one names the field
// and the value.
func TestParseTorchVersion(t *testing.T) {
	for s, want := range map[string]TorchVersion{"": {}, "2.6": {2, 6}, "2.9.0": {2, 9}, "2.10.0.dev20250916+cu130": {2, 10}} {
		got, err := ParseTorchVersion("torch_version", s)
		if err != nil || got != want {
			t.Errorf("%q: %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"2", "two.six", "2.x", "0.4", "10.1", "2.100", "-2.6"} {
		if _, err := ParseTorchVersion("--torch-version", s); err == nil || !strings.Contains(err.Error(), "--torch-version") || !strings.Contains(err.Error(), s) {
			t.Errorf("%q: error %v, want one naming the flag and the value", s, err)
		}
	}
	// Composite RMSNorm before 2.9 only; an unstated release is a recent one.
	for v, want := range map[TorchVersion]bool{{}: false, {2, 6}: true, {2, 8}: true, {2, 9}: false, {2, 10}: false, {1, 13}: true, {3, 0}: false} {
		if got := v.Before(TorchVersion{2, 9}); got != want {
			t.Errorf("%v before 2.9: %v, want %v", v, got, want)
		}
	}
}
