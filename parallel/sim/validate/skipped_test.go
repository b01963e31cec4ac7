package validate

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/parallel/sim/published"
)

// TestNeededFeature: hand-made rows of the shared table's columns.
func TestNeededFeature(t *testing.T) {
	for _, c := range []struct {
		row  map[string]string
		want string
	}{
		{map[string]string{"tp": "2", "pp": "1", "precision": "BF16", "model": "Qwen3-235B-A22B"}, ""},
		{map[string]string{"tp": "2", "pp": "1", "precision": "MXFP8 (params)", "model": "Qwen3-235B-A22B"}, ""},                                          // mxfp8 is priced
		{map[string]string{"tp": "2", "pp": "1", "precision": "NVFP4", "model": "Qwen3-235B-A22B"}, ""},                                                   // nvfp4 is priced
		{map[string]string{"precision": "FP8 (fine-grained 1x128/128x128)", "model": "DeepSeek-V3"}, ""},                                                  // fp8-blockwise is priced
		{map[string]string{"precision": "FP8 (fine-grained 1x128/128x128)", "model": "DeepSeek-V3", "gpu": "H800"}, "device (H800: not in the registry)"}, // R189
		{map[string]string{"precision": "FP8 tensorwise", "model": "Llama3-8B", "gpu": "H100 (96GB HBM2e, 500W cap; Meta Grand Teton)"}, ""},
		{map[string]string{"precision": "FP6", "model": "DeepSeek-V3"}, "FP8 / FP4 recipe (FP6)"},
		{map[string]string{"tp": "1", "pp": "8", "precision": "BF16", "model": "Qwen3-235B-A22B"}, ""},
		{map[string]string{"tp": "2", "pp": "8", "precision": "BF16", "model": "Qwen3-235B-A22B"}, ""},                                      // tp inside pipeline stages is built
		{map[string]string{"tp": "2", "pp": "8", "precision": "BF16", "model": "Qwen3-235B-A22B", "recompute": "selective: norm, act"}, ""}, // modules:layernorm,moe_act is built
		{map[string]string{"tp": "1", "pp": "8", "precision": "BF16", "model": "Qwen3-235B-A22B", "recompute": "selective: layernorm, moe_act (perf recipe @HEAD)"}, ""},
		{map[string]string{"tp": "4", "pp": "8", "precision": "BF16", "model": "Qwen3-235B-A22B", "recompute": "selective: layernorm, moe (from command in source)"}, ""}, // modules:layernorm,moe is built (R145)
		{map[string]string{"tp": "1", "precision": "BF16", "model": "DeepSeek-V3", "recompute": "selective: mla_up_proj (perf recipe @HEAD)"}, "Megatron recompute modules (mla_up_proj)"},
		{map[string]string{"tp": "2", "pp": "8", "precision": "FP8-CS", "model": "Qwen3-235B-A22B", "recompute": "selective: norm, act"}, ""},
		{map[string]string{"tp": "", "pp": "", "cp": "", "precision": "MXFP8", "model": "Qwen3-30B-A3B"}, ""},
		{map[string]string{"tp": "1", "precision": "BF16", "model": "GPT-OSS-120B"}, ""}, // gpt_oss is built (issue 40)
		{map[string]string{"tp": "1", "precision": "BF16", "model": "Nemotron-H-56B"}, "model type (Nemotron-H-56B)"},
		{map[string]string{"tp": "1", "precision": "BF16", "model": "Qwen3-30B-A3B"}, ""},
		{map[string]string{"tp": "1", "pp": "1", "cp": "1", "precision": "BF16", "model": "DeepSeek-V3"}, ""},
		{map[string]string{"tp": "1", "pp": "8", "precision": "BF16", "model": "Kimi-K2"}, ""}, // pipelines are built
		{map[string]string{"tp": "1", "pp": "8", "precision": "BF16", "model": "GPT-OSS-120B"}, ""},
		{map[string]string{"tp": "", "precision": "BF16 baseline", "model": "Kimi-K2"}, ""},
		{map[string]string{"tp": "4", "pp": "4", "precision": "FP8 (current scaling per recipe naming)", "model": "Llama3-70B"}, ""},
		{map[string]string{"tp": "4", "pp": "8", "cp": "2", "precision": "BF16", "model": "Llama3.1-405B"}, ""},     // CP inside pipeline stages is priced (R064)
		{map[string]string{"tp": "1", "pp": "1", "cp": "2", "precision": "BF16", "model": "Llama3-70B"}, ""},        // CP alone is priced (R163)
		{map[string]string{"tp": "", "pp": "", "cp": "8", "precision": "FP8 tensorwise", "model": "Llama3-8B"}, ""}, // R176
		{map[string]string{"tp": "8", "pp": "8", "precision": "BF16", "model": "Llama3.1-405B"}, ""},
		{map[string]string{"tp": "1", "pp": "1", "precision": "FP8-CS", "model": "Llama3-70B",
			"recompute": "no recompute; CPU activation offloading of 40 layers to Grace memory (perf recipe @HEAD)"}, "activation offloading"}, // R040
	} {
		if got := neededFeature(c.row); got != c.want {
			t.Errorf("%v: %q, want %q", c.row, got, c.want)
		}
	}
}

// TestShared: a row of the shared table is skipped unless its run_id is
// among the runs, with what it needs; a table without a column the
// validation reads is refused by name.
func TestShared(t *testing.T) {
	csv := "run_id,framework,model,gpu,n_gpus,cp,precision,recompute\n" +
		"R1,torchtitan,Qwen3-30B-A3B,B200,8,1,BF16,\n" +
		"R2,Megatron,Nemotron-H-56B,H100,64,1,BF16,\n" +
		"R3,Megatron,Qwen3-30B-A3B,H100,16,2,BF16,\n"
	table, err := ReadTable(strings.NewReader(csv))
	if err != nil {
		t.Fatal(err)
	}
	s := Shared([]published.Run{{RunID: "R3"}}, table)
	if s.Rows != 3 || len(s.Skipped) != 2 {
		t.Fatalf("%d rows, %d skipped; want 3 and 2", s.Rows, len(s.Skipped))
	}
	if s.Skipped[0].RunID != "R1" || s.Skipped[0].Needs != notTranscribed || s.Skipped[1].Needs != "model type (Nemotron-H-56B)" {
		t.Errorf("skipped %+v", s.Skipped)
	}
	for _, bad := range []string{"", "run_id,framework\nR1,x\n", "run_id,framework,model,gpu,n_gpus,cp,precision,recompute\nR1,x\n"} {
		if _, err := ReadTable(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "shared validation table") {
			t.Errorf("%q: %v; want an error naming the shared validation table", bad, err)
		}
	}
}
