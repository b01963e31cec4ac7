package sim

import (
	"fmt"
	"slices"
	"strings"
)

// Precisions are the training recipes of DESIGN's --precision contract.
var Precisions = []string{"bf16", "fp8-tensorwise", "fp8-rowwise", "mxfp8", "fp8-delayed", "fp8-current", "fp8-blockwise"}

// PricedPrecisions are the recipes the time and memory models price; every
// other recipe of Precisions is refused until a model of it is built.
var PricedPrecisions = []string{"bf16"}

// CheckPrecision accepts a priced recipe ("" = bf16) and refuses the others
// with the list of priced ones (and, for a name outside DESIGN's list, that
// list too). field names the flag or JSON field in the message.
func CheckPrecision(field, p string) error {
	if p == "" || slices.Contains(PricedPrecisions, p) {
		return nil
	}
	if slices.Contains(Precisions, p) {
		return fmt.Errorf("%s = %q: not priced yet (priced: %s)", field, p, strings.Join(PricedPrecisions, ", "))
	}
	return fmt.Errorf("%s = %q: unknown recipe (known: %s; priced: %s)", field, p, strings.Join(Precisions, ", "), strings.Join(PricedPrecisions, ", "))
}
