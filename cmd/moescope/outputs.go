package main

import (
	"errors"
	"fmt"

	"github.com/moescope/moescope/internal/fileio"
)

// output is a file or directory a command will write, named by its flag;
// input is one it reads.
type (
	output = fileio.Output
	input  = fileio.Input
)

// checkOutputs is checkIO for a command that reads no file it could
// overwrite.
func checkOutputs(force bool, outs ...output) error { return checkIO(force, nil, outs...) }

// checkIO is fileio.CheckIO with one path named by two flags (two outputs,
// or an output and an input) reported as a usage error.
func checkIO(force bool, ins []input, outs ...output) error {
	err := fileio.CheckIO(force, ins, outs...)
	var same *fileio.SamePathError
	if errors.As(err, &same) {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return err
}
