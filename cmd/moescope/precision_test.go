package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestSimulateLowPrecision: an mxfp8 run reports both MFUs, the converted
// sets and its quantize time, and is faster than bf16 on the same layout
// but by less than the 2× of the peaks (its attention, elementwise work
// and communication stay as they were, and the casts are added); mxfp8 on
// a part without MX formats is refused naming device and recipe.
func TestSimulateLowPrecision(t *testing.T) {
	args := []string{"simulate", "--model", "qwen3-30b-a3b", "--gpu", "b200", "--gpus", "8", "--ep", "8", "--ac", "full", "--lbs", "4", "--seq", "4096", "--json"}
	tps := map[string]float64{}
	for _, p := range []string{"bf16", "mxfp8"} {
		out, err := runSimCmd(t, append(args, "--precision", p)...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", p, err, out)
		}
		var r struct {
			TPS, MFU   float64
			MFUFP8Peak *float64 `json:"mfu_fp8_peak"`
			Quantize   []string
			Breakdown  struct {
				OverheadS map[string]float64 `json:"overhead_s"`
			}
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%s: %v\n%s", p, err, out)
		}
		tps[p] = r.TPS
		if p == "bf16" {
			if r.MFUFP8Peak != nil || r.Breakdown.OverheadS["quantize"] != 0 {
				t.Errorf("bf16 reports mfu_fp8_peak %v or quantize %v", r.MFUFP8Peak, r.Breakdown.OverheadS["quantize"])
			}
			continue
		}
		// MX peak 4.5e15 = 2 × the 2.25e15 bf16 peak (b200 registry).
		if r.MFUFP8Peak == nil || *r.MFUFP8Peak < r.MFU/2*0.999 || *r.MFUFP8Peak > r.MFU/2*1.001 {
			t.Errorf("mfu_fp8_peak %v, want mfu %v / 2", r.MFUFP8Peak, r.MFU)
		}
		if strings.Join(r.Quantize, ",") != "linear,experts" || !(r.Breakdown.OverheadS["quantize"] > 0) {
			t.Errorf("quantize %v, quantize time %v", r.Quantize, r.Breakdown.OverheadS["quantize"])
		}
	}
	if s := tps["mxfp8"] / tps["bf16"]; !(s > 1 && s < 2) {
		t.Errorf("mxfp8 over bf16: %.3f, want in (1, 2)", s)
	}
	out, err := runSimCmd(t, append(args[:len(args)-1], "--gpu", "h100", "--precision", "mxfp8")...)
	if err == nil || !strings.Contains(err.Error(), "h100") || !strings.Contains(err.Error(), "mxfp8") {
		t.Errorf("mxfp8 on h100: %v\n%s", err, out)
	}
}

// TestPlanPrecisionList: plan searches each listed recipe, says each one's
// best and keeps the fastest; an unknown recipe is refused by name, and
// fp8-blockwise on a part without block-scaled FP8 GEMMs.
func TestPlanPrecisionList(t *testing.T) {
	out, err := runSimCmd(t, "plan", "--model", "tiny", "--gpu", "b200", "--gpus", "4", "--seq", "256", "--max-lbs", "8", "--precision", "bf16,mxfp8", "--top", "2")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"precision bf16: best", "precision mxfp8: best", "kept: --precision"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan output lacks %q:\n%s", want, out)
		}
	}
	out, err = runSimCmd(t, "plan", "--model", "tiny", "--gpus", "4", "--seq", "256", "--precision", "bf16,fp6")
	if err == nil || !strings.Contains(err.Error(), "fp6") || !strings.Contains(err.Error(), "unknown recipe") {
		t.Errorf("fp6 in the list: %v\n%s", err, out)
	}
	// Block-scaled FP8 needs compute capability 9.0 (TransformerEngine):
	// refused on an AMD part, naming it.
	out, err = runSimCmd(t, "simulate", "--model", "tiny", "--gpu", "mi300x", "--gpus", "4", "--seq", "256", "--lbs", "1", "--precision", "fp8-blockwise")
	if err == nil || !strings.Contains(err.Error(), "mi300x") || !strings.Contains(err.Error(), "compute capability") {
		t.Errorf("fp8-blockwise on mi300x: %v\n%s", err, out)
	}
}

// TestSimulateNVFP4: an nvfp4 run reports mfu_fp4_peak (against the FP4
// peak, 9e15 on a B200: 4 × its 2.25e15 bf16 peak) and no mfu_fp8_peak,
// and is refused on a part without FP4 tensor cores, naming it.
func TestSimulateNVFP4(t *testing.T) {
	args := []string{"simulate", "--model", "llama3-8b", "--gpus", "8", "--lbs", "1", "--seq", "8192", "--json", "--precision", "nvfp4"}
	out, err := runSimCmd(t, append(args, "--gpu", "b200")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var r struct {
		MFU        float64
		MFUFP8Peak *float64 `json:"mfu_fp8_peak"`
		MFUFP4Peak *float64 `json:"mfu_fp4_peak"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r.MFUFP8Peak != nil || r.MFUFP4Peak == nil || *r.MFUFP4Peak < r.MFU/4*0.999 || *r.MFUFP4Peak > r.MFU/4*1.001 {
		t.Errorf("mfu_fp8_peak %v, mfu_fp4_peak %v: want none and mfu %v / 4", r.MFUFP8Peak, r.MFUFP4Peak, r.MFU)
	}
	out, err = runSimCmd(t, append(args, "--gpu", "h200")...)
	if err == nil || !strings.Contains(err.Error(), "h200") || !strings.Contains(err.Error(), "nvfp4") {
		t.Errorf("nvfp4 on h200: %v\n%s", err, out)
	}
}
