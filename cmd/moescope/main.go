// Command moescope plans and checks Mixture-of-Experts pre-training: FLOPs,
// memory, gradients, CPU kernels, goroutine-rank training, cluster
// simulation, calibration and layout planning.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := run(os.Stdout, os.Stderr, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "moescope:", err)
		os.Exit(exitCode(err))
	}
}
