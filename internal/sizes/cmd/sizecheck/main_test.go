package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	ok := t.TempDir()
	if err := os.WriteFile(filepath.Join(ok, "a.go"), []byte("package p\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	over := t.TempDir()
	src := "package p\n" + strings.Repeat("//\n", 600) // 601 lines
	if err := os.WriteFile(filepath.Join(over, "a.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args           []string
		stdout, stderr string
		err            error
	}{
		{[]string{ok}, "sizecheck: no file over 600 lines, no function over 100, no package over 4000\n", "", nil},
		{[]string{over}, "a.go: file has 601 lines, over 600\n", "sizecheck: 1 over the limits (file 600 lines, function 100, package 4000)\n", errOver},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		err := run(&stdout, &stderr, tt.args)
		if !errors.Is(err, tt.err) || stdout.String() != tt.stdout || stderr.String() != tt.stderr {
			t.Errorf("run(%q) = %v, stdout %q, stderr %q; want %v, %q, %q", tt.args, err, stdout.String(), stderr.String(), tt.err, tt.stdout, tt.stderr)
		}
	}
	if err := run(new(bytes.Buffer), new(bytes.Buffer), []string{ok, over}); err == nil || errors.Is(err, errOver) {
		t.Errorf("two arguments: err = %v, want a usage error", err)
	}
}
