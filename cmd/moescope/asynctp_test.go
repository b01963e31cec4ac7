package main

import (
	"math"
	"strings"
	"testing"
)

// TestTrainPipelineAsyncTP: train --pp 2 --tp 2 --async-tp prints exactly
// the losses of the same run without --async-tp, and those of train --gpus
// 1 on the same micro-batches within 1e-5 relative (TestTrainPipelineTP's
// pairing): async TP changes when the tp collectives run, not what they
// compute, and the numeric backend runs the same collectives in the same
// order (parallel.Pipeline.StageTPCollectives). train has no --compile
// flag (its CPU reference compiles nothing), so async TP's need of compile
// is checked where time is predicted: simulate refuses --async-tp
// --compile=false with --pp, naming async_tp and compile.
func TestTrainPipelineAsyncTP(t *testing.T) {
	args := []string{"--gpus", "4", "--pp", "2", "--tp", "2", "--lbs", "4", "--pp-microbatch-size", "2", "--steps", "3"}
	plain, async := trainJSON(t, args...), trainJSON(t, append(args, "--async-tp")...)
	one := trainJSON(t, "--gpus", "1", "--lbs", "2", "--grad-accum", "2", "--steps", "3")
	if len(plain.Losses) != 3 || len(async.Losses) != 3 || len(one.Losses) != 3 {
		t.Fatalf("losses %v, %v, %v; want 3 each", plain.Losses, async.Losses, one.Losses)
	}
	for i := range plain.Losses {
		if async.Losses[i] != plain.Losses[i] {
			t.Errorf("step %d: loss %.9g with --async-tp, %.9g without", i+1, async.Losses[i], plain.Losses[i])
		}
		if math.Abs(async.Losses[i]-one.Losses[i]) > 1e-5*math.Abs(one.Losses[i]) {
			t.Errorf("step %d: loss %.9g with --async-tp, one rank %.9g", i+1, async.Losses[i], one.Losses[i])
		}
	}
	out, err := runSimCmd(t, "simulate", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "4", "--pp", "2", "--tp", "2", "--async-tp", "--compile=false", "--lbs", "2", "--seq", "4096")
	if err == nil || !strings.Contains(err.Error(), "async_tp with tp = 2 (pp = 2) requires compile") {
		t.Errorf("simulate --pp 2 --tp 2 --async-tp --compile=false: %v\n%s\nwant the compile refusal", err, out)
	}
	out, err = runSimCmd(t, "simulate", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "4", "--pp", "2", "--tp", "2", "--async-tp", "--lbs", "2", "--seq", "4096")
	if err != nil || !strings.Contains(out, "tp 2, etp 1, sequence parallel, async (first of tp chunks exposed, the rest overlapped): tp collectives on nvlink") {
		t.Errorf("simulate --pp 2 --tp 2 --async-tp: %v\n%s", err, out)
	}
}
