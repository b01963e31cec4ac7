//go:build !linux

package kernel

import "time"

// threadCPUTime is unavailable here; measurements use wall time.
func threadCPUTime() (time.Duration, bool) { return 0, false }
