package memory

import "testing"

// TestJudge: the verdict's three fields and its line at and around the
// boundaries, by hand: a 100 GiB device, 1 GiB outside PyTorch, target 0.92
// (92 GiB of reserved memory).
func TestJudge(t *testing.T) {
	const gib = 1 << 30
	cases := []struct {
		reserved     int64
		fits, within bool
		headroom     int64
		line         string
	}{
		{50 * gib, true, true, 49 * gib, ""},
		{92 * gib, true, true, 7 * gib, ""},
		{93 * gib, true, false, 6 * gib, "above the memory target: 93.00 GiB > 0.92 × 100.00 GiB"},
		{99 * gib, true, false, 0, "above the memory target: 99.00 GiB > 0.92 × 100.00 GiB"},
		{99*gib + 1, false, false, -1, "does not fit: needs 100.00 GiB of 100.00 GiB"},
		{3171 * gib, false, false, -3072 * gib, "does not fit: needs 3172.00 GiB of 100.00 GiB"},
	}
	for _, c := range cases {
		f := Judge(c.reserved, gib, 100*gib, 0.92)
		if f.Fits != c.fits || f.WithinTarget != c.within || f.HeadroomBytes != c.headroom || f.Line() != c.line {
			t.Errorf("reserved %d: %+v, line %q; want fits %v within %v headroom %d line %q",
				c.reserved, f, f.Line(), c.fits, c.within, c.headroom, c.line)
		}
	}
}
