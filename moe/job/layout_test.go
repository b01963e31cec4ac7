package job

import (
	"strings"
	"testing"
)

// TestLayoutGradSyncLastOnly: grad-sync-last-only is FSDP2's
// set_requires_gradient_sync under fsdp and DDP's no_sync (Megatron-Core's
// no_sync_func) under zero1 and ddp, whose gradients are whole; zero2's
// sharded gradients have no such mode: refused, naming the field and the
// sharding.
func TestLayoutGradSyncLastOnly(t *testing.T) {
	for _, sh := range []Sharding{ShardFSDP, ShardZeRO2, ShardZeRO1, ShardDDP} {
		l := Layout{GPUs: 4, Sharding: sh, GradSyncLastOnly: true}
		err := l.Resolve()
		if sh != ShardZeRO2 {
			// fsdp: FSDP2's set_requires_gradient_sync; zero1 and ddp keep
			// whole gradients: DDP's no_sync, Megatron-Core's no_sync_func.
			if err != nil {
				t.Errorf("%s: %v", sh, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "grad_sync_last_only") || !strings.Contains(err.Error(), string(sh)) {
			t.Errorf("%s: err = %v, want one naming grad_sync_last_only and %s", sh, err, sh)
		}
	}
}

// TestLayoutFSDPImpl: fsdp2 (the default, stored as "") and megatron are
// accepted under fsdp; megatron is refused, naming fsdp_impl and the
// offending setting, with another sharding, with pp, with replicas (HSDP)
// and with FSDP2-only options; an unknown implementation is refused with the allowed names.
func TestLayoutFSDPImpl(t *testing.T) {
	l := Layout{GPUs: 4, FSDPImpl: FSDPTorch, ReshardAfterForward: true}
	if err := l.Resolve(); err != nil || l.FSDPImpl != "" {
		t.Errorf("fsdp2: err %v, impl %q (want the default, \"\")", err, l.FSDPImpl)
	}
	if l = (Layout{GPUs: 4, FSDPImpl: FSDPMegatron, ReshardAfterForward: true}); l.Resolve() != nil {
		t.Errorf("megatron under fsdp: %v", l.Resolve())
	}
	for _, c := range []struct {
		l    Layout
		want string
	}{
		{Layout{GPUs: 4, FSDPImpl: "deepspeed", ReshardAfterForward: true}, "fsdp2 or megatron"},
		{Layout{GPUs: 4, FSDPImpl: FSDPMegatron, Sharding: ShardZeRO1, ReshardAfterForward: true}, "zero1"},
		{Layout{GPUs: 4, FSDPImpl: FSDPMegatron, PP: 2, ReshardAfterForward: true}, "pp = 2"},
		{Layout{GPUs: 4, DPReplicate: 2, FSDPImpl: FSDPMegatron, ReshardAfterForward: true}, "dp_replicate = 2"},
		{Layout{GPUs: 4, FSDPImpl: FSDPMegatron, KeepGathered: true, ReshardAfterForward: true}, "keep_gathered"},
		{Layout{GPUs: 4, FSDPImpl: FSDPMegatron}, "reshard_after_forward"},
	} {
		err := c.l.Resolve()
		if err == nil || !strings.Contains(err.Error(), "fsdp_impl") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err = %v, want one naming fsdp_impl and %q", c.l, err, c.want)
		}
	}
}
