//go:build !linux

package kernel

import "time"

// threadCPUTime is unavailable here; measurements use wall time.
func threadCPUTime() (time.Duration, bool) { return 0, false }

// ProcessCPUTime is unavailable here.
func ProcessCPUTime() (time.Duration, bool) { return 0, false }
