package fileio

import (
	"errors"
	"fmt"
	"io"
)

// TooLargeError reports an input longer than its bound.
type TooLargeError struct {
	Path string
	Max  int64
}

func (e *TooLargeError) Error() string { return fmt.Sprintf("%s: larger than %d bytes", e.Path, e.Max) }

// ReadBounded reads the whole of path if it is a regular file
// (OpenRegular: a device, FIFO or socket is refused, never read or waited
// on) holding at most max bytes; a longer one is refused after max+1 bytes
// with a *TooLargeError.
func ReadBounded(path string, max int64) ([]byte, error) {
	f, err := OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, &TooLargeError{Path: path, Max: max}
	}
	return data, nil
}

// MaxJSONFileBytes bounds a cluster or calibration JSON read from disk:
// real ones are a few KiB.
const MaxJSONFileBytes = 1 << 20

// ReadJSONFile reads at most MaxJSONFileBytes of path, and refuses a longer
// file.
func ReadJSONFile(path string) ([]byte, error) {
	data, err := ReadBounded(path, MaxJSONFileBytes)
	var big *TooLargeError
	if errors.As(err, &big) {
		return nil, fmt.Errorf("%w: not a moescope JSON file", err)
	}
	return data, err
}
