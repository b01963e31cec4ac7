package verdict

import "testing"

// TestJudge: the verdict's fields and its line at and around the
// boundaries, by hand: a 100 GiB device, 1 GiB outside PyTorch, target 0.92
// (92 GiB of reserved memory), and the stored memory band (internal/band's
// bands.json: low 0.9024, high 1.2009 of the predicted peak): a peak of P
// GiB fits for sure when 1.2009·P + 1 ≤ 100 (P ≤ 82.44), cannot fit when
// 0.9024·P + 1 > 100 (P > 109.71), and may not fit between; at P = 92 the
// interval is 0.9024·92 = 83.0% to 1.2009·92 = 110.5% of the device.
func TestJudge(t *testing.T) {
	const gib = 1 << 30
	cases := []struct {
		reserved     int64
		fits, within bool
		headroom     int64
		verdict      string
		line         string
	}{
		{50 * gib, true, true, 49 * gib, Fits, ""},
		{82 * gib, true, true, 17 * gib, Fits, ""},
		{92 * gib, true, true, 7 * gib, MayNotFit, "may not fit: needs 93.00 GiB of 100.00 GiB, and the memory model's 90% interval of peak reserved (83.0%–110.5% of the device) reaches past it"},
		{93 * gib, true, false, 6 * gib, MayNotFit, "above the memory target: 93.00 GiB > 0.92 × 100.00 GiB"},
		{99 * gib, true, false, 0, MayNotFit, "above the memory target: 99.00 GiB > 0.92 × 100.00 GiB"},
		{99*gib + 1, false, false, -1, MayNotFit, "does not fit: needs 100.00 GiB of 100.00 GiB"},
		{111 * gib, false, false, -12 * gib, DoesNotFit, "does not fit: needs 112.00 GiB of 100.00 GiB"},
		{3171 * gib, false, false, -3072 * gib, DoesNotFit, "does not fit: needs 3172.00 GiB of 100.00 GiB"},
	}
	for _, c := range cases {
		f := Judge(c.reserved, gib, 100*gib, 0.92)
		if f.Fits != c.fits || f.WithinTarget != c.within || f.HeadroomBytes != c.headroom || f.Verdict != c.verdict || f.Line() != c.line {
			t.Errorf("reserved %d: %+v, line %q; want fits %v within %v headroom %d verdict %q line %q",
				c.reserved, f, f.Line(), c.fits, c.within, c.headroom, c.verdict, c.line)
		}
	}
}
