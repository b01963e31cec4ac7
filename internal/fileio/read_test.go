package fileio

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestReadBounded: a file of exactly max bytes is read whole; one byte more
// is refused with the path and the bound.
func TestReadBounded(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadBounded(p, 5); err != nil || string(b) != "12345" {
		t.Errorf("at the bound: %q, %v", b, err)
	}
	var big *TooLargeError
	if _, err := ReadBounded(p, 4); !errors.As(err, &big) || err.Error() != p+": larger than 4 bytes" {
		t.Errorf("over the bound: %v", err)
	}
}
