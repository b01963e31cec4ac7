package fileio

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "out.bin")
	write := func(s string) func(w io.Writer) error {
		return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
	}
	if err := WriteFileAtomic(p, false, write("one")); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(p, false, write("two")); !errors.Is(err, ErrExists) {
		t.Errorf("second write without force: %v, want ErrExists", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "one" {
		t.Errorf("file = %q after refused overwrite", b)
	}
	if err := WriteFileAtomic(p, true, write("three")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "three" {
		t.Errorf("file = %q after forced overwrite", b)
	}
	boom := errors.New("boom")
	if err := WriteFileAtomic(filepath.Join(dir, "failed"), false, func(io.Writer) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("failing writer: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only out.bin (no temporaries, no partial file)", len(entries))
	}
}
