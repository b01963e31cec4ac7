package kernel

import (
	"os"
	"strconv"
	"strings"
)

// AvailableMemory is the memory this machine can give a new process
// without swapping, in bytes: MemAvailable from /proc/meminfo, or 0 where
// that file does not exist or does not say (another OS). The commands that
// run the reference on this CPU bound their runs by it.
func AvailableMemory() uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				if kb, err := strconv.ParseUint(f[0], 10, 64); err == nil && kb < 1<<50 {
					return kb << 10
				}
			}
		}
	}
	return 0
}
