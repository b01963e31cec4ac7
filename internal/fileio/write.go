package fileio

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// ErrExists reports that an output file exists and overwriting was not asked for.
var ErrExists = errors.New("file exists (use --force to overwrite)")

// WriteFileAtomic writes a file the way every moescope command must
// (DESIGN.md, "Files"): write fills a temporary file in path's directory,
// which is synced and then moved into place, so readers never see a partial
// file. Without force an existing path is left alone and the error wraps
// ErrExists; the no-overwrite case uses a hard link, which fails atomically
// if path appeared meanwhile.
func WriteFileAtomic(path string, force bool, write func(io.Writer) error) (err error) {
	if !force {
		if _, err := os.Lstat(path); err == nil {
			return fmt.Errorf("%s: %w", path, ErrExists)
		}
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp*")
	if err != nil {
		return err
	}
	name := tmp.Name()
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(name)
		}
	}()
	if err = write(tmp); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Chmod(name, 0o644); err != nil {
		return err
	}
	if force {
		// Rename replaces whatever path names: only a regular file (or a
		// link, which rename replaces, not its target) may be replaced.
		if st, err := os.Lstat(path); err == nil && !st.Mode().IsRegular() && st.Mode()&fs.ModeSymlink == 0 {
			return fmt.Errorf("%s: %s: --force replaces only regular files", path, kind(st.Mode()))
		}
		return os.Rename(name, path)
	}
	if err = os.Link(name, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s: %w", path, ErrExists)
		}
		// Some file systems have no hard links: fall back to a checked rename.
		if _, serr := os.Lstat(path); serr == nil {
			return fmt.Errorf("%s: %w", path, ErrExists)
		}
		err = os.Rename(name, path)
		return err
	}
	return os.Remove(name)
}
