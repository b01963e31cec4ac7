package main

import (
	"encoding/json"
	"errors"
	"math"
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
// (tiny's 2 layers over 4 stages for the multi-stage ones), give the losses (cross-entropy and aux) of train
// --gpus 1 on the same global batch (4 sequences a step), the pipeline's
// micro-batches of one sequence being that rank's micro-steps
// (PipelineTrainer's doc). The aux loss is per micro-batch (DESIGN), so
// the one rank runs them as micro-steps of one sequence; without it, one
// micro-step of all four gives the same losses too.
//
// Equal within lossTol, not bit for bit: the ranks sum gradients over
// their micro-batches and peers in another order than the one rank does
// (float32 addition is not associative), so from the second step the
// losses differ in their last bits (7.5e-9 of 4.165 under --ep 2, 1.8e-9
// relative). An error of the schedule moves them by far more: aux losses
// taken over micro-batches of two sequences instead of one (train --lbs 2
// --grad-accum 2 against --lbs 1 --grad-accum 4) move the second step's
// loss by 6e-7 relative and its aux loss by 1e-2.
func TestTrainPipelineLosses(t *testing.T) {
	const lossTol = 1e-7 // relative
	losses := func(args ...string) []float64 {
		t.Helper()
		out, err := runSimCmd(t, append([]string{"train", "--model", "tiny", "--seq", "16", "--steps", "3", "--peak-gflops", "100", "--json"}, args...)...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		var r struct {
			Losses    []float64 `json:"losses"`
			AuxLosses []float64 `json:"aux_losses"`
		}
		// The JSON report is on stdout, the step lines on stderr after it.
		if i := strings.Index(out, "{"); i < 0 || json.NewDecoder(strings.NewReader(out[i:])).Decode(&r) != nil || len(r.Losses) != 3 || len(r.AuxLosses) != 3 {
			t.Fatalf("%v: want the JSON report with 3 losses\n%s", args, out)
		}
		return append(r.Losses, r.AuxLosses...)
	}
	same := func(got, want []float64) bool {
		for i := range want {
			if math.Abs(got[i]-want[i]) > lossTol*math.Abs(want[i]) {
				return false
			}
		}
		return true
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
		if got := losses(args...); !same(got, one) {
			t.Errorf("%v: losses and aux %v, train --gpus 1 %v (relative tolerance %g)", args, got, one, lossTol)
		}
	}
	noAux := losses("--gpus", "1", "--lbs", "4", "--aux-coef", "0")
	for _, args := range [][]string{{"--pp", "2", "--gpus", "2", "--lbs", "4", "--aux-coef", "0"}, {"--pp", "2", "--dp-shard", "2", "--gpus", "4", "--lbs", "2", "--aux-coef", "0"},
		{"--pp", "2", "--ep", "2", "--gpus", "4", "--lbs", "2", "--aux-coef", "0"}} {
		if got := losses(args...); !same(got, noAux) {
			t.Errorf("%v: losses and aux %v, train --gpus 1 --lbs 4 %v (relative tolerance %g)", args, got, noAux, lossTol)
		}
	}
}
