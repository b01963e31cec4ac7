package parallel

import (
	"fmt"
	"io"
	"os"
)

// maxJSONFileBytes bounds a cluster or calibration JSON read from disk:
// real ones are a few KiB; a device or pipe (/dev/zero) must not be read
// forever.
const maxJSONFileBytes = 1 << 20

// readJSONFile reads at most maxJSONFileBytes of path, and refuses a longer
// file.
func readJSONFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxJSONFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxJSONFileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes: not a moescope JSON file", path, maxJSONFileBytes)
	}
	return data, nil
}
