package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/moescope/moescope/internal/fileio"
)

// output is a file or directory a command will write, named by the flag
// that asks for it.
type output struct{ flag, path string }

// checkOutputs refuses, before any work is done, every output a command
// could not write once its work is over: a path named by two flags, a path
// that exists while force is off (DESIGN.md, "Files": the error wraps
// fileio.ErrExists and nothing is touched), and a path whose parent directory
// is missing or is not a directory (the atomic write creates its temporary
// file there). Outputs with an empty path are not asked for and skipped.
func checkOutputs(force bool, outs ...output) error {
	seen := map[string]string{}
	for _, o := range outs {
		if o.path == "" {
			continue
		}
		abs, err := filepath.Abs(o.path)
		if err != nil {
			return fmt.Errorf("%s %s: %w", o.flag, o.path, err)
		}
		if prev, dup := seen[abs]; dup {
			return fmt.Errorf("%w: %s and %s name the same path %s", errUsage, prev, o.flag, o.path)
		}
		seen[abs] = o.flag
		if _, err := os.Lstat(o.path); err == nil && !force {
			return fmt.Errorf("%s: %w", o.path, fileio.ErrExists)
		}
		dir := filepath.Dir(abs)
		st, err := os.Stat(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("%s %s: directory %s does not exist", o.flag, o.path, dir)
		case err != nil:
			return fmt.Errorf("%s %s: %w", o.flag, o.path, err)
		case !st.IsDir():
			return fmt.Errorf("%s %s: %s is not a directory", o.flag, o.path, dir)
		}
	}
	return nil
}
