//go:build unix

package fileio

import (
	"os"
	"syscall"
)

// openNonBlocking opens path read-only with O_NONBLOCK: opening a FIFO for
// reading otherwise waits for a writer forever. The flag has no effect on
// the regular files OpenRegular accepts.
func openNonBlocking(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
