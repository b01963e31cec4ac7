package moe

import (
	"strings"
	"testing"
)

// TestLayoutGradSyncLastOnly: grad-sync-last-only is FSDP2's
// set_requires_gradient_sync, so it is accepted under fsdp and refused,
// naming the field and the sharding, under every other mode.
func TestLayoutGradSyncLastOnly(t *testing.T) {
	for _, sh := range []Sharding{ShardFSDP, ShardZeRO2, ShardZeRO1, ShardDDP} {
		l := Layout{GPUs: 4, Sharding: sh, GradSyncLastOnly: true}
		err := l.Resolve()
		if sh == ShardFSDP {
			if err != nil {
				t.Errorf("fsdp: %v", err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "grad_sync_last_only") || !strings.Contains(err.Error(), string(sh)) {
			t.Errorf("%s: err = %v, want one naming grad_sync_last_only and %s", sh, err, sh)
		}
	}
}
