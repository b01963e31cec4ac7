package kernel

import (
	"os"
	"testing"
)

// TestAvailableMemory: where /proc/meminfo exists (Linux) its MemAvailable
// is read: more than nothing and less than 2^50 KiB; elsewhere it is 0.
func TestAvailableMemory(t *testing.T) {
	got := AvailableMemory()
	if _, err := os.Stat("/proc/meminfo"); err != nil {
		if got != 0 {
			t.Errorf("no /proc/meminfo: %d, want 0", got)
		}
		return
	}
	if got == 0 || got >= 1<<60 {
		t.Errorf("AvailableMemory = %d bytes", got)
	}
}
