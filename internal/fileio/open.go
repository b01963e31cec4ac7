package fileio

import (
	"fmt"
	"io/fs"
	"os"
)

// OpenRegular opens path for reading only if it is a regular file. It
// opens without blocking (openNonBlocking), so a FIFO with no writer is
// refused instead of hanging the command, and checks the opened file, not
// the path, so nothing can swap it in between.
func OpenRegular(path string) (*os.File, error) {
	f, err := openNonBlocking(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %s, not a regular file", path, kind(st.Mode()))
	}
	return f, nil
}

// kind names a file mode for errors.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "a special file"
}
