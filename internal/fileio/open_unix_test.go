//go:build unix

package fileio

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInputFIFODoesNotHang: a FIFO with no writer, named as an input, is
// refused at once (it used to block every command in open), and so are a
// device that never ends and a directory, each named for what it is.
func TestInputFIFODoesNotHang(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	done := make(chan error, 1)
	go func() { _, err := ReadBounded(fifo, 1<<10); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "a named pipe (FIFO), not a regular file") {
			t.Errorf("FIFO: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("reading a FIFO with no writer hung")
	}
	for path, want := range map[string]string{"/dev/zero": "a character device", t.TempDir(): "a directory"} {
		if _, err := ReadBounded(path, 1<<10); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", path, err, want)
		}
	}
}
