package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

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
	var r flopsReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	c, _ := hf.Load("deepseek-v3")
	total, active, _ := flops.MTPParams(c)
	meg, _ := flops.MegatronMTPPerStep(c, flops.Shape{Seq: 64, Batch: 1}, 128)
	if r.MTPModules != 1 || r.MTP == nil || r.MTP.ParamsTotal != total || r.MTP.ParamsActive != active ||
		r.MTP.MegatronPerStep != meg || r.FLOPsPerStep[flops.Megatron] >= meg {
		t.Errorf("--mtp report %+v, want %d / %d params, Megatron %d > %d", r.MTP, total, active, meg, r.FLOPsPerStep[flops.Megatron])
	}
	_, err = runCmd(t, "flops", "--model", "deepseek-v2-lite", "--mtp")
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "num_nextn_predict_layers = 0") {
		t.Errorf("--mtp on a model without MTP: %v", err)
	}
}
