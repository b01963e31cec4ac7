package plan

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// TestExportFilterCounts feeds hand-picked points: two ZeRO points, two
// DDP points with different dp_shard (one reason), a keep-gathered ZeRO-2
// point (two reasons, one candidate) and two FSDP points torchtitan can run.
func TestExportFilterCounts(t *testing.T) {
	f := &ExportFilter{Targets: []TorchtitanTarget{TorchtitanTOML}}
	pt := func(s job.Sharding, shard int, keep bool) Point {
		return Point{Layout: job.Layout{GPUs: 64, DPShard: shard, DPReplicate: 64 / shard, EP: 1, Sharding: s,
			ReshardAfterForward: true, KeepGathered: keep}, AC: moe.AC{Mode: moe.ACFull}, LBS: 1, GradAccum: 2}
	}
	refused := 0
	for _, p := range []Point{pt(job.ShardZeRO1, 8, false), pt(job.ShardZeRO2, 8, false), pt(job.ShardDDP, 8, false),
		pt(job.ShardDDP, 32, false), pt(job.ShardZeRO2, 8, true), pt(job.ShardFSDP, 8, false), pt(job.ShardDDP, 1, false)} {
		if f.Admit(p) != nil {
			refused++
		}
	}
	counted, reasons := f.Refusals()
	if refused != 5 || counted != 5 {
		t.Fatalf("refused %d (counted %d), want 5", refused, counted)
	}
	// Most frequent first, ties in the order of their text.
	want := []Refusal{{Reason: "sharding = ddp with dp_shard = N", Count: 2}, {Reason: "sharding = zero2", Count: 2},
		{Reason: "keep_gathered = true", Count: 1}, {Reason: "sharding = zero1", Count: 1}}
	if len(reasons) != len(want) {
		t.Fatalf("reasons %v, want %v", reasons, want)
	}
	for i, w := range want {
		if r := reasons[i]; r.Reason != w.Reason || r.Count != w.Count || !strings.Contains(r.Why, "torchtitan v0.2.2 TOML") {
			t.Errorf("reason %d: %+v, want %q × %d explained for the TOML target", i, r, w.Reason, w.Count)
		}
	}
}

// TestExportFilterZeroBubbleCompiled: with a compiled model the TOML
// export leaves out zero-bubble pipelines (TorchtitanAdmit with a compiled
// model), the config-registry export and an eager TOML export keep them.
func TestExportFilterZeroBubbleCompiled(t *testing.T) {
	l := job.Layout{GPUs: 16, PP: 2, PPSchedule: job.PPZBVZeroBubble, Sharding: job.ShardFSDP}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	p := Point{Layout: l, AC: moe.AC{Mode: moe.ACFull}, LBS: 4, GradAccum: 1}
	toml := &ExportFilter{Targets: []TorchtitanTarget{TorchtitanTOML}, Compiled: true}
	if err := toml.Admit(p); err == nil || !strings.Contains(err.Error(), "pp_schedule = ZBVZeroBubble with a compiled model") {
		t.Errorf("TOML, compiled: %v, want the point left out by pp_schedule", err)
	}
	for _, f := range []*ExportFilter{{Targets: []TorchtitanTarget{TorchtitanPy}, Compiled: true}, {Targets: []TorchtitanTarget{TorchtitanTOML}}} {
		if err := f.Admit(p); err != nil {
			t.Errorf("%v, compiled %v: %v, want the point kept", f.Targets, f.Compiled, err)
		}
	}
}
