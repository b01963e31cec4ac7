package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
	"github.com/moescope/moescope/flops"
	"github.com/moescope/moescope/moe/hf"
)

// TestFlopsMTP: the MTP modules are left out and said so by default; --mtp
// adds flops.MTPParams (pinned by hand in flops.TestMTPByHand) and
// Megatron's count with them, and is refused, naming the model and the
// key, for a model without MTP modules.
func TestFlopsMTP(t *testing.T) {
	out, err := runCmd(t, "flops", "--model", "deepseek-v3", "--seq", "64")
	if err != nil || !strings.Contains(out, "MTP: 1 module(s) (num_nextn_predict_layers) not counted") {
		t.Fatalf("default output (%v) does not say the MTP module is uncounted:\n%.600s", err, out)
	}
	out, err = runCmd(t, "flops", "--model", "deepseek-v3", "--seq", "64", "--mtp", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var r report.Flops
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	c, _ := hf.Load("deepseek-v3")
	total, active, _ := flops.MTPParams(c)
	meg, _ := flops.MegatronMTPPerStep(c, flops.Shape{Seq: 64, Batch: 1}, 128)
	if r.MTPModules != 1 || r.MTP == nil || r.MTP.ParamsTotal != total || r.MTP.ParamsActive != active ||
		r.MTP.MegatronPerStep != meg || r.FLOPsPerStep[flops.Megatron] >= meg {
		t.Fatalf("--mtp report %+v, want %d / %d params, Megatron %d > %d", r.MTP, total, active, meg, r.FLOPsPerStep[flops.Megatron])
	}
	// The model convention: flops.MTPModelPerStep (pinned by hand in
	// flops.TestMTPModelByHand) added to the main model's count.
	model, _ := flops.MTPModelPerStep(c, flops.Shape{Seq: 64, Batch: 1})
	if r.MTP.ModelPerStep != model || r.MTP.ModelTotalPerStep != r.FLOPsPerStep[flops.Model]+model ||
		r.MTP.ModelTotalPerToken != float64(r.MTP.ModelTotalPerStep)/64 {
		t.Errorf("--mtp model FLOPs %+v, want the modules' %d added to %d", r.MTP, model, r.FLOPsPerStep[flops.Model])
	}
	out, err = runCmd(t, "flops", "--model", "deepseek-v3", "--seq", "64", "--mtp")
	if err != nil || !strings.Contains(out, "MTP (--mtp): 1 module(s)") || !strings.Contains(out, "with them, per token: model") {
		t.Errorf("--mtp text output (%v) does not give the counts with the MTP module:\n%.800s", err, out)
	}
	_, err = runCmd(t, "flops", "--model", "deepseek-v2-lite", "--mtp")
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "num_nextn_predict_layers = 0") {
		t.Errorf("--mtp on a model without MTP: %v", err)
	}
}

// TestMTPRefusedOutsideFlops: the commands that execute the model or
// predict its memory or time leave the MTP modules out, so --mtp is a usage
// error there that says so and points at flops --mtp.
func TestMTPRefusedOutsideFlops(t *testing.T) {
	for _, args := range [][]string{
		{"memory", "--model", "deepseek-v3", "--gpus", "256", "--seq", "4096", "--lbs", "1", "--mtp"},
		{"simulate", "--model", "deepseek-v3", "--gpus", "256", "--seq", "4096", "--lbs", "1", "--mtp"},
		{"plan", "--model", "deepseek-v3", "--gpus", "256", "--mtp"},
		{"train", "--model", "tiny", "--gpus", "1", "--lbs", "1", "--seq", "8", "--steps", "1", "--mtp"},
	} {
		_, err := runCmd(t, args...)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--mtp: not used by moescope "+args[0]) ||
			!strings.Contains(err.Error(), "moescope flops --mtp counts") {
			t.Errorf("%v: error %v, want --mtp refused", args, err)
		}
	}
}
