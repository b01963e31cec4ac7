// Command moescope plans and checks Mixture-of-Experts pre-training: FLOPs,
// memory, gradients, CPU kernels, goroutine-rank training, cluster
// simulation, calibration and layout planning.
//
// It holds flag parsing, printing and plotting only; the work is the
// packages'. It imports every package it drives; nothing imports it.
package main

import (
	"fmt"
	"os"
)

func main() {
	err := run(os.Stdout, os.Stderr, os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "moescope:", err)
		os.Exit(exitCode(err))
	}
}
