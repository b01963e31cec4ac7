package main

import (
	"errors"
	"fmt"

	"github.com/moescope/moescope/internal/fileio"
)

// output is a file or directory a command will write, named by its flag.
type output = fileio.Output

// checkOutputs is fileio.CheckOutputs with one path named by two flags
// reported as a usage error.
func checkOutputs(force bool, outs ...output) error {
	err := fileio.CheckOutputs(force, outs...)
	var same *fileio.SamePathError
	if errors.As(err, &same) {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return err
}
