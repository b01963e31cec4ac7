// Command sizecheck reports every Go file, function and package of a tree
// that is over the limits of package sizes (internal/sizes says which and
// why):
//
//	go run ./internal/sizes/cmd/sizecheck [DIR]
//
// DIR defaults to the current directory. It prints one line per violation
// and exits 1 if there is any; otherwise it prints a one-line summary and
// exits 0. An unreadable tree or a file that does not parse exits 2.
//
// It imports internal/sizes only; nothing imports it.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/moescope/moescope/internal/sizes"
)

func main() {
	err := run(os.Stdout, os.Stderr, os.Args[1:])
	switch {
	case errors.Is(err, errOver):
		os.Exit(1)
	case err != nil:
		fmt.Fprintln(os.Stderr, "sizecheck:", err)
		os.Exit(2)
	}
}

// errOver is run's error when something is over a limit; the violations
// are already printed.
var errOver = errors.New("over the size limits")

func run(stdout, stderr io.Writer, args []string) error {
	root := "."
	switch len(args) {
	case 0:
	case 1:
		root = args[0]
	default:
		return fmt.Errorf("usage: sizecheck [DIR] (got %d arguments)", len(args))
	}
	vs, err := sizes.Check(root)
	if err != nil {
		return err
	}
	for _, v := range vs {
		fmt.Fprintln(stdout, v)
	}
	if len(vs) > 0 {
		fmt.Fprintf(stderr, "sizecheck: %d over the limits (file %d lines, function %d, package %d)\n",
			len(vs), sizes.MaxFileLines, sizes.MaxFuncLines, sizes.MaxPackageLines)
		return errOver
	}
	fmt.Fprintf(stdout, "sizecheck: no file over %d lines, no function over %d, no package over %d\n",
		sizes.MaxFileLines, sizes.MaxFuncLines, sizes.MaxPackageLines)
	return nil
}
