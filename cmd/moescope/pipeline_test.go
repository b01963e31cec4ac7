package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestPipelineFlags: --pp and its options reach memory and simulate (text
// lines per pipeline rank, JSON keys of DESIGN's layout contract), and
// what is not built is refused naming the flag or field.
func TestPipelineFlags(t *testing.T) {
	out, err := runSimCmd(t, "simulate", "--model", "tiny", "--gpus", "8", "--pp", "2", "--pp-schedule", "Interleaved1F1B", "--pp-layers", "0,1,1,0",
		"--pp-microbatch-size", "2", "--lbs", "4", "--seq", "64", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var r struct {
		Layout   map[string]any `json:"layout"`
		Pipeline struct {
			Stages []map[string]any `json:"stages"`
		} `json:"pipeline"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for k, want := range map[string]any{"pp": 2.0, "pp_schedule": "Interleaved1F1B", "pp_microbatch_size": 2.0, "pp_virtual_stages": 2.0, "dp_shard": 4.0} {
		if r.Layout[k] != want {
			t.Errorf("layout %s = %v, want %v", k, r.Layout[k], want)
		}
	}
	if got := r.Layout["pp_layers"]; len(got.([]any)) != 4 || r.Layout["reshard_after_forward"] != false {
		t.Errorf("layout pp_layers %v, reshard_after_forward %v (torchtitan's default under pp: false)", got, r.Layout["reshard_after_forward"])
	}
	if len(r.Pipeline.Stages) != 2 {
		t.Errorf("%d pipeline stages in JSON, want 2", len(r.Pipeline.Stages))
	}
	out, err = runSimCmd(t, "simulate", "--model", "tiny", "--gpus", "4", "--pp", "4", "--lbs", "4", "--seq", "64")
	if err != nil || !strings.Contains(out, "pp rank 3: stages [3]") || !strings.Contains(out, "exposed pipeline_bubble") {
		t.Errorf("simulate text: %v\n%s", err, out)
	}
	out, err = runSimCmd(t, "memory", "--model", "tiny", "--gpus", "4", "--pp", "2", "--lbs", "4", "--seq", "64")
	if err != nil || !strings.Contains(out, "gpus 4 = pp 2 × dp_replicate 1 × dp_shard 2") || !strings.Contains(out, "pp rank 1: stages [1]") {
		t.Errorf("memory text: %v\n%s", err, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"memory", "--pp-schedule", "LoopedBFS", "--pp", "2"}, "pp_schedule = LoopedBFS: torchtitan's schedule is not built yet; built: one of [GPipe 1F1B Interleaved1F1B InterleavedZeroBubble ZBVZeroBubble DualPipeV]"},
		{[]string{"memory", "--pp-schedule", "DualPipeV", "--pp", "2", "--pp-microbatch-size", "2"}, "2 micro-batches: DualPipeV needs at least as many as stages, 2 × pp = 2 × 2 = 4"},
		{[]string{"memory", "--pp-schedule", "ZBVZeroBubble", "--pp", "2", "--pp-virtual-stages", "3"}, "pp_virtual_stages = 3: must be 2 for the V-shaped schedule ZBVZeroBubble"},
		{[]string{"memory", "--pp", "3"}, "gpus = 4 is not divisible by pp × dp_replicate × tp = 3 × 1 × 1 = 3"},
		{[]string{"memory", "--pp", "2", "--dp-shard", "4", "--dp-replicate", "1"}, "pp × dp_replicate × dp_shard × tp = 2 × 1 × 4 × 1 ≠ gpus = 4"},
		{[]string{"memory", "--pp-microbatch-size", "0", "--pp", "2"}, "--pp-microbatch-size = 0: must be in [1,"},
		{[]string{"memory", "--pp-virtual-stages", "2"}, "pp_virtual_stages = 2: a pipeline option needs pp > 1"},
		{[]string{"memory", "--pp", "2", "--pp-layers", "1,x"}, `pp_layers = 1,x: stage 1 = "x"`},
		{[]string{"memory", "--pp", "2", "--pp-microbatch-size", "3"}, "lbs = 4 is not a multiple of pp_microbatch_size = 3"},
		{[]string{"train", "--pp", "2", "--dp-shard", "2", "--sharding", "zero2", "--steps", "1"}, "sharding zero2 over dp_shard 2 inside a pipeline stage: not built (built: fsdp)"},
		{[]string{"train", "--pp", "2", "--steps", "1", "--checkpoint", "x"}, "--checkpoint with --pp = 2: checkpoints under pipelines are not built"},
	} {
		args := append(c.args, "--model", "tiny", "--gpus", "4", "--lbs", "4", "--seq", "64")
		out, err := runSimCmd(t, args...)
		if err == nil || !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want a usage error containing %q\n%s", c.args, err, c.want, out)
		}
	}
}

// TestTrainPipelineLosses: train --pp 2 --gpus 2, train --pp 2
// --dp-shard 2 --gpus 4, train --pp 2 --ep 2 --gpus 4 (expert
// parallelism over the stage's two dp_shard ranks), train --pp 2
// --dp-replicate 2 --gpus 4 and --dp-replicate 2 --dp-shard 2 --ep 2
// --gpus 8 (HSDP inside the stages), under 1F1B, GPipe,
// Interleaved1F1B and the zero-bubble schedules
// (tiny's 2 layers over 4 stages for the multi-stage ones), print the losses (cross-entropy and aux) of train
// --gpus 1 on the same global batch (4 sequences a step), the pipeline's
// micro-batches of one sequence being that rank's micro-steps
// (PipelineTrainer's doc). The aux loss is per micro-batch (DESIGN), so
// the one rank runs them as micro-steps of one sequence; without it, one
// micro-step of all four gives the same losses too.
func TestTrainPipelineLosses(t *testing.T) {
	losses := func(args ...string) []string {
		t.Helper()
		out, err := runSimCmd(t, append([]string{"train", "--model", "tiny", "--seq", "16", "--steps", "3", "--peak-gflops", "100"}, args...)...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		var ls []string
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 5 && f[0] == "step" {
				ls = append(ls, f[3]+" "+f[5]) // loss, aux
			}
		}
		if len(ls) != 3 {
			t.Fatalf("%v: %d step lines\n%s", args, len(ls), out)
		}
		return ls
	}
	one := losses("--gpus", "1", "--lbs", "1", "--grad-accum", "4")
	for _, args := range [][]string{{"--pp", "2", "--gpus", "2", "--lbs", "4"}, {"--pp", "2", "--gpus", "2", "--lbs", "2", "--grad-accum", "2", "--pp-schedule", "GPipe"},
		{"--pp", "2", "--dp-shard", "2", "--gpus", "4", "--lbs", "2"},
		{"--pp", "2", "--gpus", "2", "--lbs", "4", "--pp-schedule", "ZBVZeroBubble"},
		{"--pp", "2", "--dp-shard", "2", "--gpus", "4", "--lbs", "2", "--pp-schedule", "InterleavedZeroBubble"},
		{"--pp", "2", "--gpus", "2", "--lbs", "4", "--pp-schedule", "DualPipeV"},
		{"--pp", "2", "--ep", "2", "--gpus", "4", "--lbs", "2"},
		{"--pp", "2", "--ep", "2", "--gpus", "4", "--lbs", "2", "--pp-schedule", "Interleaved1F1B"},
		{"--pp", "2", "--ep", "2", "--gpus", "4", "--lbs", "2", "--pp-schedule", "ZBVZeroBubble"},
		{"--pp", "2", "--dp-replicate", "2", "--gpus", "4", "--lbs", "2"},
		{"--pp", "2", "--dp-replicate", "2", "--dp-shard", "2", "--ep", "2", "--gpus", "8", "--lbs", "1", "--pp-schedule", "Interleaved1F1B"}} {
		if got := losses(args...); strings.Join(got, " ") != strings.Join(one, " ") {
			t.Errorf("%v: losses %v, train --gpus 1 %v", args, got, one)
		}
	}
	noAux := losses("--gpus", "1", "--lbs", "4", "--aux-coef", "0")
	for _, args := range [][]string{{"--pp", "2", "--gpus", "2", "--lbs", "4", "--aux-coef", "0"}, {"--pp", "2", "--dp-shard", "2", "--gpus", "4", "--lbs", "2", "--aux-coef", "0"},
		{"--pp", "2", "--ep", "2", "--gpus", "4", "--lbs", "2", "--aux-coef", "0"}} {
		if got := losses(args...); strings.Join(got, " ") != strings.Join(noAux, " ") {
			t.Errorf("%v: losses %v, train --gpus 1 --lbs 4 %v", args, got, noAux)
		}
	}
}
