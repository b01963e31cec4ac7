package fileio

import (
	"fmt"
	"io"
	"os"
)

// MaxJSONFileBytes bounds a cluster or calibration JSON read from disk:
// real ones are a few KiB; a device or pipe (/dev/zero) must not be read
// forever.
const MaxJSONFileBytes = 1 << 20

// ReadJSONFile reads at most MaxJSONFileBytes of path, and refuses a longer
// file.
func ReadJSONFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxJSONFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxJSONFileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes: not a moescope JSON file", path, MaxJSONFileBytes)
	}
	return data, nil
}
