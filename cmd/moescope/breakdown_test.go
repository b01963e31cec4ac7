package main

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
)

// TestBreakdownOneShape: plan's best plan and simulate of the same point
// print the same breakdown object (keys and values), since both come from
// one simulation of one schedule.
func TestBreakdownOneShape(t *testing.T) {
	out, err := runSimCmd(t, "plan", "--model", "tiny", "--gpus", "8", "--seq", "128", "--max-lbs", "4", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var p struct {
		Best struct {
			DPShard     int             `json:"dp_shard"`
			DPReplicate int             `json:"dp_replicate"`
			EP          int             `json:"ep"`
			Sharding    string          `json:"sharding"`
			Reshard     bool            `json:"reshard_after_forward"`
			AC          string          `json:"ac"`
			LBS         int             `json:"lbs"`
			GradAccum   int             `json:"grad_accum"`
			Breakdown   json.RawMessage `json:"breakdown"`
		} `json:"best"`
	}
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	b := p.Best
	args := []string{"simulate", "--model", "tiny", "--gpus", "8", "--seq", "128", "--dp-shard", fmt.Sprint(b.DPShard),
		"--dp-replicate", fmt.Sprint(b.DPReplicate), "--ep", fmt.Sprint(b.EP), "--sharding", b.Sharding,
		fmt.Sprintf("--reshard-after-forward=%v", b.Reshard), "--ac", b.AC, "--lbs", fmt.Sprint(b.LBS),
		"--grad-accum", fmt.Sprint(b.GradAccum), "--json"}
	sout, err := runSimCmd(t, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, sout)
	}
	var s struct {
		Breakdown json.RawMessage `json:"breakdown"`
	}
	if err := json.Unmarshal([]byte(sout), &s); err != nil {
		t.Fatalf("%v\n%s", err, sout)
	}
	var fromPlan, fromSim map[string]any
	if err := json.Unmarshal(b.Breakdown, &fromPlan); err != nil {
		t.Fatalf("plan's breakdown is not an object: %v\n%s", err, b.Breakdown)
	}
	if err := json.Unmarshal(s.Breakdown, &fromSim); err != nil {
		t.Fatalf("simulate's breakdown is not an object: %v\n%s", err, s.Breakdown)
	}
	if !reflect.DeepEqual(fromPlan, fromSim) {
		t.Errorf("breakdowns differ:\nplan     %s\nsimulate %s", b.Breakdown, s.Breakdown)
	}
	for _, k := range []string{"compute_s", "recompute_s", "optimizer_s", "exposed_comm_s", "comm_s", "compute_by_class_s", "overhead_s"} {
		if _, ok := fromPlan[k]; !ok {
			t.Errorf("breakdown lacks %q: %s", k, b.Breakdown)
		}
	}
}
