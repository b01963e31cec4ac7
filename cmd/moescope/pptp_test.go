package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestPlanCommandPPTP: with --pp and --tp the real evaluator searches
// pipelines with tensor parallelism inside their stages (the tiny model,
// 2 layers: pp 2; 4 heads, 2 KV heads: tp 2); the stage table gains both
// best-degree columns, and --json plans carry both degrees with the
// global batch over the data-parallel ranks only.
func TestPlanCommandPPTP(t *testing.T) {
	// One host: the search's one stage keeps every family's best plan.
	text, rep := planTextAndJSON(t, "--model", "tiny", "--gpus", "8", "--seq", "64", "--max-lbs", "4", "--global-batch", "32",
		"--pp", "1,2", "--tp", "1,2", "--top", "100000")
	if !strings.Contains(text, "best pp") || !strings.Contains(text, "best tp") {
		t.Errorf("stage table without the best-pp and best-tp columns:\n%s", text)
	}
	both := 0
	for _, p := range rep.Plans {
		if p.PP > 1 && p.TP > 1 {
			both++
			if p.PP*p.DPReplicate*p.DPShard*p.TP != 8 || p.LBS*p.DPReplicate*p.DPShard*p.GradAccum != 32 || p.PPSchedule == "" || p.ETP < 1 {
				t.Errorf("pp × tp plan %+v: degrees, global batch or pipeline fields inconsistent", p)
			}
		}
	}
	if both == 0 {
		t.Errorf("no pp × tp plan among %d", len(rep.Plans))
	}
}

// TestPlanCommandPPTPBadInput: degrees that give no layout are an error
// (exit 1) naming the degree and the bound, whether the model refuses tp
// under pp (tp 8 for 4 heads and 2 KV heads), the sequence does (seq 66
// is not a multiple of 2·tp = 4) or the mesh does (pp × tp = 32 on 16 GPUs).
func TestPlanCommandPPTPBadInput(t *testing.T) {
	base := []string{"--model", "tiny", "--gpus", "16", "--max-lbs", "4"}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--seq", "64", "--pp", "2", "--tp", "8"}, []string{"no feasible plan on 16 GPUs", "tp = 8 does not divide heads = 4", "kv_heads = 2"}},
		{[]string{"--seq", "66", "--pp", "2", "--tp", "2"}, []string{"no feasible plan", "seq = 66 is not divisible by tp × 2·cp = 2 × 2·1 = 4"}},
		{[]string{"--seq", "64", "--pp", "2", "--tp", "16"}, []string{"pp × tp = 2 × 16 does not divide gpus = 16"}},
	} {
		var out, errb bytes.Buffer
		err := run(&out, &errb, append(append([]string{"plan"}, base...), c.args...))
		if err == nil || exitCode(err) != 1 {
			t.Errorf("%v: err %v (exit %d), want exit 1", c.args, err, exitCode(err))
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %q lacks %q", c.args, err, w)
			}
		}
	}
}

// TestPlanCommandPipelineSmallGlobalBatch: one sequence per GPU of global
// batch and pipelines of micro-batches of 2: the stage before the target
// bounds local batches by a data-parallel rank's share (1 × pp × tp), not
// one sequence per GPU, below a pipeline's one micro-batch (the planner
// panicked on the empty range of local batches).
func TestPlanCommandPipelineSmallGlobalBatch(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(&out, &errb, []string{"plan", "--model", "tiny", "--gpus", "16", "--seq", "64", "--global-batch", "16",
		"--pp", "1,2", "--tp", "1,2", "--pp-microbatch-sizes", "2", "--json"}); err != nil {
		t.Fatal(err)
	}
	var rep planReportJSON
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if b := rep.Best; b.LBS*b.DPReplicate*b.DPShard*b.GradAccum != 16 {
		t.Errorf("best %+v does not consume the global batch of 16", b)
	}
}
