package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/plan"
)

// TestExportNarrowingReport: the narrowing names the flags and the target,
// the refused candidates out of all the stages enumerated, and each reason
// with its count (plan.ExportFilter's counts are its own test's).
func TestExportNarrowingReport(t *testing.T) {
	n := newExportNarrowing("job.toml", "", false)
	pt := func(s job.Sharding, shard int) plan.Point {
		return plan.Point{Layout: job.Layout{GPUs: 64, DPShard: shard, DPReplicate: 64 / shard, EP: 1, Sharding: s,
			ReshardAfterForward: true}, AC: moe.AC{Mode: moe.ACFull}, LBS: 1, GradAccum: 2}
	}
	for _, p := range []plan.Point{pt(job.ShardZeRO2, 8), pt(job.ShardDDP, 8), pt(job.ShardDDP, 32), pt(job.ShardFSDP, 8)} {
		n.Admit(p)
	}
	var b bytes.Buffer
	n.report(&b, &plan.Report{Stages: []plan.Stage{{Candidates: 4}, {Candidates: 3}}, Simulated: 2})
	for _, w := range []string{"moescope plan: --torchtitan-toml narrows the search to what torchtitan v0.2.2 TOML can express: 3 of 7 candidates left out before simulation (2 simulated):\n",
		"\n  2 × sharding = ddp with dp_shard = N: ", "\n  1 × sharding = zero2: "} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("report lacks %q:\n%s", w, b.String())
		}
	}
	b.Reset()
	newExportNarrowing("job.toml", "job.py", false).report(&b, &plan.Report{})
	if b.Len() > 0 {
		t.Errorf("nothing refused: %q, want no report", b.String())
	}
	if newExportNarrowing("", "", true) != nil {
		t.Error("no export: narrowing should be nil")
	}
}
