package fileio

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckOutputs(t *testing.T) {
	dir := t.TempDir()
	exists := filepath.Join(dir, "exists")
	if err := os.WriteFile(exists, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(dir, "fresh")
	if err := CheckOutputs(false, Output{Flag: "--a", Path: fresh}, Output{Flag: "--b", Path: ""}, Output{Flag: "--c", Path: ""}); err != nil {
		t.Errorf("a new file in an existing directory, two unset flags: %v", err)
	}
	if err := CheckOutputs(false, Output{Flag: "--a", Path: exists}); !errors.Is(err, ErrExists) {
		t.Errorf("existing file without force: %v, want ErrExists", err)
	}
	if err := CheckOutputs(true, Output{Flag: "--a", Path: exists}); err != nil {
		t.Errorf("existing file with force: %v", err)
	}
	err := CheckOutputs(true, Output{Flag: "--a", Path: fresh}, Output{Flag: "--b", Path: filepath.Join(dir, ".", "fresh")})
	var same *SamePathError
	if !errors.As(err, &same) || !strings.Contains(err.Error(), "--a and --b") {
		t.Errorf("one path named twice: %v, want a SamePathError naming both flags", err)
	}
	err = CheckOutputs(false, Output{Flag: "--a", Path: filepath.Join(dir, "missing", "f")})
	if err == nil || !strings.Contains(err.Error(), "--a") || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing directory: %v", err)
	}
	err = CheckOutputs(false, Output{Flag: "--a", Path: filepath.Join(exists, "f")})
	if err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Errorf("parent is a file: %v", err)
	}
	if b, _ := os.ReadFile(exists); string(b) != "keep" {
		t.Errorf("existing file changed: %q", b)
	}
}
