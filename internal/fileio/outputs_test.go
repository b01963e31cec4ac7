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

// TestReplaceDir: a marked directory is replaced by the new one and nothing
// is left aside; an unmarked one is refused and kept; without force an
// existing one is ErrExists.
func TestReplaceDir(t *testing.T) {
	root := t.TempDir()
	mk := func(name, marker string) string {
		d := filepath.Join(root, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, marker), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		return d
	}
	old, fresh := mk("ck", ".mark"), mk("tmp", ".mark")
	if err := ReplaceDir(fresh, old, ".mark", false); !errors.Is(err, ErrExists) {
		t.Errorf("without force: %v", err)
	}
	if err := ReplaceDir(fresh, old, ".mark", true); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(old, ".mark")); string(b) != "tmp" {
		t.Errorf("replaced directory holds %q", b)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 1 {
		t.Errorf("left beside it: %v", ents)
	}
	users := mk("users", "data.txt")
	fresh = mk("tmp2", ".mark")
	if err := ReplaceDir(fresh, users, ".mark", true); err == nil {
		t.Error("an unmarked directory was replaced")
	}
	if _, err := os.Stat(filepath.Join(users, "data.txt")); err != nil {
		t.Errorf("the unmarked directory lost its file: %v", err)
	}
}
