package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestTPFlags: --tp, --etp and --async-tp reach the layout of simulate and
// memory (JSON keys tp, etp, async_tp; simulate says where the tp
// collectives run), and bad values are usage errors naming the factor.
func TestTPFlags(t *testing.T) {
	out, err := runSimCmd(t, "simulate", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--tp", "4", "--async-tp", "--lbs", "1", "--seq", "4096", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var r struct {
		Layout map[string]any `json:"layout"`
		TPLink string         `json:"tp_link"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r.Layout["tp"] != 4.0 || r.Layout["etp"] != 1.0 || r.Layout["async_tp"] != true || r.Layout["dp_shard"] != 2.0 || r.TPLink != "nvlink" {
		t.Errorf("layout %v, tp_link %q; want tp 4, etp 1, async_tp, dp_shard 2, nvlink", r.Layout, r.TPLink)
	}
	// Hosts of 4 GPUs: a tp group of 8 spans two NVLink domains.
	out, err = runSimCmd(t, "simulate", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--tp", "8", "--gpus-per-node", "4", "--lbs", "1", "--seq", "4096")
	if err != nil || !strings.Contains(out, "tp 8, etp 1, sequence parallel: tp collectives on network") {
		t.Errorf("tp over the network: %v\n%s", err, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"memory", "--model", "llama3-8b", "--gpus", "8", "--tp", "3", "--lbs", "1", "--seq", "4096"}, "dp_replicate × tp = 1 × 3"},
		{[]string{"memory", "--model", "llama3-8b", "--gpus", "16", "--tp", "16", "--lbs", "1", "--seq", "4096"}, "tp = 16 does not divide kv_heads = 8"},
		{[]string{"memory", "--model", "qwen3-30b-a3b", "--gpus", "8", "--tp", "2", "--ep", "2", "--etp", "4", "--lbs", "1", "--seq", "4096"}, "etp = 4: must be 1 or tp = 2"},
		{[]string{"memory", "--model", "llama3-8b", "--gpus", "8", "--tp", "0", "--lbs", "1", "--seq", "4096"}, "--tp = 0"},
		{[]string{"simulate", "--model", "llama3-8b", "--gpus", "8", "--tp", "2", "--async-tp", "--compile=false", "--lbs", "1", "--seq", "4096"}, "async_tp"},
		// train executes tp × ep inside pipeline stages
		// (TestTrainPipelineTP) under FSDP, not under the other sharding
		// modes: the refusal names every factor.
		{[]string{"train", "--model", "tiny", "--gpus", "8", "--tp", "2", "--pp", "2", "--ep", "2", "--dp-shard", "2", "--sharding", "zero1", "--lbs", "1", "--seq", "8", "--steps", "1"},
			"sharding zero1 over dp_shard 2 inside a pipeline stage: not built (built: fsdp); gpus 8 = pp 2 × dp_replicate 1 × dp_shard 2 × tp 2, ep 2, etp 1"},
	} {
		out, err := runSimCmd(t, c.args...)
		if err == nil || !strings.Contains(out+err.Error(), c.want) {
			t.Errorf("%v: %v\n%s\nwant an error containing %q", c.args, err, out, c.want)
		}
		if c.args[0] != "simulate" && !errors.Is(err, errUsage) {
			t.Errorf("%v: %v is not a usage error", c.args, err)
		}
	}
	out, err = runSimCmd(t, "memory", "--model", "llama3-8b", "--gpus", "8", "--tp", "2", "--lbs", "1", "--seq", "4096")
	if err != nil || !strings.Contains(out, "dp_shard 4 × tp 2") {
		t.Errorf("memory --tp 2: %v\n%s", err, out)
	}
}

// TestPlanTP: plan --tp searches the tensor-parallel degrees given; the
// ones the model cannot split (Qwen3-30B-A3B has 4 KV heads) are refused,
// and a plan with tp reports it in JSON with the global batch over the
// data-parallel ranks only (lbs × dp_replicate × dp_shard × grad_accum).
func TestPlanTP(t *testing.T) {
	args := []string{"--model", "qwen3-30b-a3b", "--gpu", "b200", "--gpus", "16", "--seq", "4096", "--global-batch", "256", "--top", "50", "--json"}
	js, _, err := planRun(t, append(args, "--tp", "1,2")...)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Plans []map[string]any `json:"plans"`
	}
	if err := json.Unmarshal([]byte(js), &rep); err != nil {
		t.Fatal(err)
	}
	withTP := 0
	for _, p := range rep.Plans {
		if p["tp"] == nil {
			continue
		}
		withTP++
		if p["tp"] != 2.0 {
			t.Errorf("plan %v: tp not 1 or 2", p)
		}
		if gb := p["lbs"].(float64) * p["dp_replicate"].(float64) * p["dp_shard"].(float64) * p["grad_accum"].(float64); gb != 256 {
			t.Errorf("plan %v: global batch %v, want 256", p, gb)
		}
	}
	if withTP == 0 {
		t.Errorf("no plan with tp 2 among %d", len(rep.Plans))
	}
	if _, _, err := planRun(t, append(args, "--tp", "8")...); err == nil {
		t.Error("tp 8 for 4 KV heads: a plan was found")
	}
	if _, _, err := planRun(t, append(args, "--tp", "2,x")...); err == nil || !strings.Contains(err.Error(), "--tp") {
		t.Errorf("--tp 2,x: %v", err)
	}
}
