//go:build !unix

package fileio

import "os"

// openNonBlocking opens path read-only; these systems have no FIFOs that
// block an open.
func openNonBlocking(path string) (*os.File, error) { return os.Open(path) }
