package fileio

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Output is a file or directory a command will write, named by the flag
// that asks for it.
type Output struct{ Flag, Path string }

// SamePathError reports two output flags that name one path.
type SamePathError struct {
	Flags [2]string
	Path  string
}

func (e *SamePathError) Error() string {
	return fmt.Sprintf("%s and %s name the same path %s", e.Flags[0], e.Flags[1], e.Path)
}

// CheckOutputs refuses, before any work is done, every output a command
// could not write once its work is over: a path named by two flags (a
// *SamePathError), a path that exists while force is off (DESIGN.md,
// "Files": the error wraps ErrExists and nothing is touched), and a path
// whose parent directory is missing or is not a directory (the atomic write
// creates its temporary file there). Outputs with an empty path are not
// asked for and skipped.
func CheckOutputs(force bool, outs ...Output) error {
	seen := map[string]string{}
	for _, o := range outs {
		if o.Path == "" {
			continue
		}
		abs, err := filepath.Abs(o.Path)
		if err != nil {
			return fmt.Errorf("%s %s: %w", o.Flag, o.Path, err)
		}
		if prev, dup := seen[abs]; dup {
			return &SamePathError{Flags: [2]string{prev, o.Flag}, Path: o.Path}
		}
		seen[abs] = o.Flag
		if _, err := os.Lstat(o.Path); err == nil && !force {
			return fmt.Errorf("%s: %w", o.Path, ErrExists)
		}
		dir := filepath.Dir(abs)
		st, err := os.Stat(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("%s %s: directory %s does not exist", o.Flag, o.Path, dir)
		case err != nil:
			return fmt.Errorf("%s %s: %w", o.Flag, o.Path, err)
		case !st.IsDir():
			return fmt.Errorf("%s %s: %s is not a directory", o.Flag, o.Path, dir)
		}
	}
	return nil
}
