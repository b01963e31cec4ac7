package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/plan"
)

// TestExportNarrowingCounts feeds hand-picked points: two ZeRO points, two
// DDP points with different dp_shard (one reason), a keep-gathered ZeRO-2
// point (two reasons, one candidate) and two FSDP points torchtitan can run.
func TestExportNarrowingCounts(t *testing.T) {
	n := newExportNarrowing("job.toml", "", false)
	pt := func(s job.Sharding, shard int, keep bool) plan.Point {
		return plan.Point{Layout: job.Layout{GPUs: 64, DPShard: shard, DPReplicate: 64 / shard, EP: 1, Sharding: s,
			ReshardAfterForward: true, KeepGathered: keep}, AC: moe.AC{Mode: moe.ACFull}, LBS: 1, GradAccum: 2}
	}
	refused := 0
	for _, p := range []plan.Point{pt(job.ShardZeRO1, 8, false), pt(job.ShardZeRO2, 8, false), pt(job.ShardDDP, 8, false),
		pt(job.ShardDDP, 32, false), pt(job.ShardZeRO2, 8, true), pt(job.ShardFSDP, 8, false), pt(job.ShardDDP, 1, false)} {
		if n.admit(p) != nil {
			refused++
		}
	}
	if refused != 5 || n.refused != 5 {
		t.Fatalf("refused %d (counted %d), want 5", refused, n.refused)
	}
	want := map[string]int{"sharding = zero1": 1, "sharding = zero2": 2, "sharding = ddp with dp_shard = N": 2, "keep_gathered = true": 1}
	if len(n.reasons) != len(want) {
		t.Errorf("reasons %v, want %v", n.reasons, want)
	}
	for k, v := range want {
		if n.reasons[k] != v {
			t.Errorf("reason %q: %d, want %d (all: %v)", k, n.reasons[k], v, n.reasons)
		}
	}
	var b bytes.Buffer
	n.report(&b, &plan.Report{Stages: []plan.Stage{{Candidates: 7}}, Simulated: 2})
	for _, w := range []string{"--torchtitan-toml narrows the search to what torchtitan v0.2.2 TOML can express: 5 of 7 candidates left out before simulation (2 simulated):",
		"  2 × sharding = zero2: ", "  2 × sharding = ddp with dp_shard = N: "} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("report lacks %q:\n%s", w, b.String())
		}
	}
	if newExportNarrowing("", "", true) != nil {
		t.Error("no export: narrowing should be nil")
	}
}

// TestExportNarrowingZeroBubbleCompiled: with a compiled model the TOML
// export leaves out zero-bubble pipelines (plan.TorchtitanAdmit with a compiled model), the
// config-registry export and an eager TOML export keep them.
func TestExportNarrowingZeroBubbleCompiled(t *testing.T) {
	l := job.Layout{GPUs: 16, PP: 2, PPSchedule: job.PPZBVZeroBubble, Sharding: job.ShardFSDP}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	p := plan.Point{Layout: l, AC: moe.AC{Mode: moe.ACFull}, LBS: 4, GradAccum: 1}
	if err := newExportNarrowing("job.toml", "", true).admit(p); err == nil || !strings.Contains(err.Error(), "pp_schedule = ZBVZeroBubble with a compiled model") {
		t.Errorf("TOML, compiled: %v, want the point left out by pp_schedule", err)
	}
	for _, n := range []*exportNarrowing{newExportNarrowing("", "job.py", true), newExportNarrowing("job.toml", "", false)} {
		if err := n.admit(p); err != nil {
			t.Errorf("%v: %v, want the point kept", n.flags, err)
		}
	}
}
