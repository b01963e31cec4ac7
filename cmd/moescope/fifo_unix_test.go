//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestEveryInputRefusesFIFO: each file input, named as a FIFO with no
// writer, is refused at once; every one of these used to hang in open.
func TestEveryInputRefusesFIFO(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	tokens := filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(tokens, []byte("[[1,2,3]]"), 0o644); err != nil {
		t.Fatal(err)
	}
	sim := []string{"simulate", "--model", "tiny", "--gpus", "4", "--lbs", "1", "--seq", "8"}
	for _, args := range [][]string{
		{"flops", "--model", fifo},
		{"grad", "--model", "tiny", "--weights", fifo, "--tokens", tokens},
		{"grad", "--model", "tiny", "--init", "1", "--tokens", fifo},
		{"calibrate", "--runs", fifo, "--out", filepath.Join(dir, "cal.json")},
		append(sim, "--cluster", fifo),
		append(sim, "--calibration", fifo),
	} {
		done := make(chan error, 1)
		go func() { _, err := runCmd(t, args...); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "a named pipe (FIFO), not a regular file") {
				t.Errorf("%v: %v", args, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%v hung on a FIFO", args)
		}
	}
}
