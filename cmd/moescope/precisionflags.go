package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/moescope/moescope/parallel/sim"
)

// addPrecisionFlag defines --precision (DESIGN's recipes, default bf16) on
// a command that predicts time or memory.
func addPrecisionFlag(fs *flag.FlagSet) *string {
	return fs.String("precision", "bf16", "training recipe: "+strings.Join(sim.Precisions, "|")+
		" (priced: "+strings.Join(sim.PricedPrecisions, ", ")+"; the others are refused)")
}

// checkPrecisionFlag refuses a recipe no model prices, as a usage error
// naming the flag and the priced recipes.
func checkPrecisionFlag(p string) error {
	if err := sim.CheckPrecision("--precision", p); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}
