package fileio

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Output is a file or directory a command will write, named by the flag
// that asks for it. Marker, when set, makes it a directory that moescope
// writes whole, holding a file of that name: an existing directory is
// replaced only if it holds the marker.
type Output struct{ Flag, Path, Marker string }

// Input is a file or directory a command reads, named by its flag.
type Input struct{ Flag, Path string }

// SamePathError reports two flags that name one path: two outputs, or an
// output and an input it would overwrite.
type SamePathError struct {
	Flags [2]string
	Path  string
}

func (e *SamePathError) Error() string {
	return fmt.Sprintf("%s and %s name the same path %s", e.Flags[0], e.Flags[1], e.Path)
}

// CheckOutputs is CheckIO for a command that reads no file it could
// overwrite.
func CheckOutputs(force bool, outs ...Output) error { return CheckIO(force, nil, outs...) }

// CheckIO refuses, before any work is done, every output a command could
// not or must not write once its work is over:
//   - a path named by two outputs, or an output that is one of the inputs
//     (the same file by device and inode, or the same cleaned path for one
//     that does not exist yet) or holds one: a *SamePathError;
//   - a path that exists while force is off (DESIGN.md, "Files": the error
//     wraps ErrExists and nothing is touched);
//   - with force, an existing output that is not a regular file (a device,
//     FIFO, socket or directory), or for a directory output, one that is
//     not moescope's (CheckReplaceDir);
//   - a path whose parent directory is missing or is not a directory (the
//     atomic write creates its temporary file there).
//
// Outputs and inputs with an empty path are not asked for and skipped.
func CheckIO(force bool, ins []Input, outs ...Output) error {
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
		if err := checkNotInput(o, abs, ins); err != nil {
			return err
		}
		if st, err := os.Lstat(o.Path); err == nil {
			if !force {
				return fmt.Errorf("%s: %w", o.Path, ErrExists)
			}
			if err := checkReplaceable(o, st); err != nil {
				return err
			}
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

// checkNotInput refuses an output that is, or (for a directory output)
// holds, one of the inputs.
func checkNotInput(o Output, abs string, ins []Input) error {
	ost, oerr := os.Stat(o.Path)
	for _, in := range ins {
		if in.Path == "" {
			continue
		}
		// An input that is not on disk (a built-in model or cluster name)
		// cannot be overwritten.
		ist, err := os.Stat(in.Path)
		if err != nil {
			continue
		}
		iabs, err := filepath.Abs(in.Path)
		if err != nil {
			return fmt.Errorf("%s %s: %w", in.Flag, in.Path, err)
		}
		same := iabs == abs || (o.Marker != "" && strings.HasPrefix(iabs, abs+string(filepath.Separator))) ||
			(oerr == nil && os.SameFile(ist, ost))
		if same {
			return &SamePathError{Flags: [2]string{o.Flag, in.Flag}, Path: o.Path}
		}
	}
	return nil
}

// checkReplaceable refuses to let force replace what an output must never
// replace.
func checkReplaceable(o Output, st fs.FileInfo) error {
	if o.Marker != "" {
		return CheckReplaceDir(o.Path, o.Marker)
	}
	if m := st.Mode(); !m.IsRegular() && m&fs.ModeSymlink == 0 {
		return fmt.Errorf("%s %s: %s: --force replaces only regular files", o.Flag, o.Path, kind(m))
	}
	return nil
}

// CheckReplaceDir refuses to replace dir unless it is a directory holding
// marker (so moescope wrote it) and none of the file system root, the
// working directory or one of its ancestors.
func CheckReplaceDir(dir, marker string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s: %s, not a directory moescope wrote", dir, kind(st.Mode()))
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	if wd, err := os.Getwd(); err == nil {
		if real, err := filepath.EvalSymlinks(wd); err == nil {
			wd = real
		}
		if abs == wd || strings.HasPrefix(wd, abs+string(filepath.Separator)) || abs == filepath.Dir(abs) {
			return fmt.Errorf("%s: the working directory or one of its ancestors: never replaced", dir)
		}
	}
	if m, err := os.Lstat(filepath.Join(dir, marker)); err != nil || !m.Mode().IsRegular() {
		return fmt.Errorf("%s: holds no %s, so moescope did not write it: not replaced (remove it yourself if it is yours to lose)", dir, marker)
	}
	return nil
}

// ReplaceDir moves the finished directory tmp to dir. With force, an
// existing dir is replaced only after CheckReplaceDir passes: it is moved
// aside, tmp is renamed into place, and only then is the old one removed,
// so a failure leaves the old directory where it was.
func ReplaceDir(tmp, dir, marker string, force bool) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return os.Rename(tmp, dir)
	}
	if !force {
		return fmt.Errorf("%s: %w", dir, ErrExists)
	}
	if err := CheckReplaceDir(dir, marker); err != nil {
		return err
	}
	aside, err := os.MkdirTemp(filepath.Dir(filepath.Clean(dir)), "."+filepath.Base(dir)+".old-")
	if err != nil {
		return err
	}
	// MkdirTemp made an empty directory to reserve the name; rename needs
	// it gone (renaming onto an empty directory fails on some systems).
	if err := os.Remove(aside); err != nil {
		return err
	}
	if err := os.Rename(dir, aside); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if rerr := os.Rename(aside, dir); rerr != nil {
			return fmt.Errorf("%w; the old directory is kept at %s", err, aside)
		}
		return err
	}
	return os.RemoveAll(aside)
}
