package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/cmd/moescope/internal/report"
)

// runCmd runs the CLI and returns stdout and the error.
func runCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errw bytes.Buffer
	err := run(&out, &errw, args)
	return out.String(), err
}

// TestFlopsJSONTiny checks the JSON schema and values on the built-in tiny
// model (V 64, D 32, L 2, H 4, G 2, d 8; layer 0 dense Fd 48; layer 1 MoE,
// E 4, K 2, F 16) at s = 8, b = 2, worked by hand.
func TestFlopsJSONTiny(t *testing.T) {
	out, err := runCmd(t, "flops", "--model", "tiny", "--seq", "8", "--batch", "2", "--ac", "full", "--tile", "1x1", "--gpu", "h100", "--tps", "1000", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Params struct {
			Total, Active int64
		}
		FLOPsPerToken map[string]float64 `json:"flops_per_token"`
		FLOPsPerStep  map[string]int64   `json:"flops_per_step"`
		MFU           map[string]float64 `json:"mfu_by_convention"`
		HFU           float64            `json:"hfu"`
		NonMatmul     map[string]int64   `json:"non_matmul_elements"`
		Tokens        int64
		AC            string
		AttentionTile [2]int `json:"attention_tile"`
		Layers        []struct {
			Layer int
			Kind  string
			Ops   []struct {
				Op             string
				Unit           string
				Forward        int64
				BackwardData   int64 `json:"backward_data"`
				BackwardWeight int64 `json:"backward_weight"`
				Recompute      int64
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	// Params: embedding 2048 + LM head 2048 + final norm 32 + 2·(3072 + 80)
	// + dense FFN 4608 + router 128 + experts 6144 = 21312; active swaps
	// 6144 for 2 of 4 experts (3072).
	if r.Params.Total != 21312 || r.Params.Active != 18240 {
		t.Errorf("params %+v", r.Params)
	}
	// Per step: torchtitan 16·(6·16192 + 2·6·4·16·8), Megatron
	// 16·(46080 + 36864 + 24576) + 49152, model 6·265216, hardware under full
	// with exact tiles 6·265216 + 2·(2·2304) + 2·(265216 − 32768); see
	// flops/flops_test.go for the term-by-term derivation.
	want := map[string]int64{
		"torchtitan": 16 * 103296, "palm": 16 * 103296, "megatron": 16*(46080+36864+24576) + 49152,
		"model": 6 * 265216, "hardware": 6*265216 + 2*2*2304 + 2*(265216-32768),
	}
	for k, w := range want {
		if r.FLOPsPerStep[k] != w || r.FLOPsPerToken[k] != float64(w)/16 {
			t.Errorf("%s: per step %d per token %v, want %d", k, r.FLOPsPerStep[k], r.FLOPsPerToken[k], w)
		}
		// MFU = FLOPs/token · TPS / H100 BF16 peak 989e12.
		if m := float64(w) / 16 * 1000 / 989e12; math.Abs(r.MFU[k]-m) > 1e-18 {
			t.Errorf("%s: mfu %g want %g", k, r.MFU[k], m)
		}
	}
	if r.HFU != r.MFU["hardware"] || r.Tokens != 16 || r.AC != "full" || r.AttentionTile != [2]int{1, 1} {
		t.Errorf("hfu %v tokens %d ac %s tile %v", r.HFU, r.Tokens, r.AC, r.AttentionTile)
	}
	// Layers: embed, 0 (dense), 1 (moe), head; layer 1's expert_gate is
	// 2·16·2·16·32 = 32768 FLOPs in each of the four passes under full.
	if len(r.Layers) != 4 || r.Layers[0].Kind != "embed" || r.Layers[1].Kind != "dense" || r.Layers[2].Kind != "moe" || r.Layers[3].Kind != "head" {
		t.Fatalf("layers %+v", r.Layers)
	}
	found := false
	for _, o := range r.Layers[2].Ops {
		if o.Op == "expert_gate" {
			found = true
			if o.Unit != "flops" || o.Forward != 32768 || o.BackwardData != 32768 || o.BackwardWeight != 32768 || o.Recompute != 32768 {
				t.Errorf("expert_gate %+v", o)
			}
		}
	}
	if !found {
		t.Error("no expert_gate row")
	}
	// Loss: T·V = 1024 elements forward and backward.
	if r.NonMatmul["loss"] != 2048 {
		t.Errorf("loss elements %d", r.NonMatmul["loss"])
	}
}

func TestFlopsText(t *testing.T) {
	out, err := runCmd(t, "flops", "--model", "qwen3-30b-a3b", "--seq", "4096", "--tps", "10000")
	if err != nil {
		t.Fatal(err)
	}
	// shared/REFERENCES.md worked example, derived independently in
	// flops.TestQwen3WorkedExample.
	for _, want := range []string{"30,532,122,624", "3,353,032,704", "2.7915e+10", "2.3006e+10",
		"torchtitan", "megatron", "palm", "model", "hardware", "HFU", "MFU (b200, 10000 tok/s)", "0-47"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestFlopsBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "config.json")
	os.WriteFile(bad, []byte("{\n  \"model_type\": \"qwen3_moe\",\n  oops\n}"), 0o644)
	unknown := filepath.Join(dir, "unknown.json")
	os.WriteFile(unknown, []byte(`{"model_type": "jamba"}`), 0o644)
	huge := filepath.Join(dir, "huge.json")
	os.WriteFile(huge, []byte(`{"model_type":"llama","vocab_size":16777216,"hidden_size":16777216,"num_hidden_layers":2,
		"num_attention_heads":1,"head_dim":16777216,"intermediate_size":16777216}`), 0o644)
	for _, tc := range []struct {
		args  []string
		want  string
		usage bool
	}{
		{[]string{"flops"}, "--model is required", true},
		{[]string{"flops", "--model", "gpt5"}, "qwen3-30b-a3b", false},
		{[]string{"flops", "--model", bad}, "line 3, column 3", false},
		{[]string{"flops", "--model", unknown}, "not supported (supported: deepseek, deepseek_v2, deepseek_v3, glm4_moe, gpt_oss", false},
		{[]string{"flops", "--model", huge, "--seq", "16777216", "--batch", "16777216"}, "overflows int64", false},
		{[]string{"flops", "--model", "tiny", "--seq", "0"}, "seq = 0", true},
		{[]string{"flops", "--model", "tiny", "--ac", "sometimes"}, "--ac", true},
		{[]string{"flops", "--model", "tiny", "--tile", "0x4"}, "--tile", true},
		{[]string{"flops", "--model", "tiny", "--tps", "-3"}, "--tps = -3", true},
		{[]string{"flops", "--model", "tiny", "--gpu", "a100", "--tps", "1000"}, "b200", true},
		{[]string{"flops", "--model", "tiny", "extra"}, "unexpected argument", true},
	} {
		_, err := runCmd(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
			continue
		}
		if (exitCode(err) == 2) != tc.usage {
			t.Errorf("%v: exit code %d", tc.args, exitCode(err))
		}
	}
}

func TestModels(t *testing.T) {
	out, err := runCmd(t, "models")
	if err != nil {
		t.Fatal(err)
	}
	// Published/hand-derived counts pinned in moe/hf TestBuiltinParams and TestLlama4BuiltinParams.
	for _, want := range []string{"qwen3-30b-a3b", "30,532,122,624", "3,353,032,704", "llama3-8b", "8,030,261,248", "llama3-70b", "70,553,706,496", "llama3.1-405b", "405,853,388,800", "glm-4.5-air", "tiny-dense", "gpt-oss-120b", "116,829,156,672", "gpt-oss-20b", "20,914,757,184",
		"llama-4-scout", "107,769,861,120", "llama-4-maverick", "400,711,848,960"} {
		if !strings.Contains(out, want) {
			t.Errorf("models output lacks %q", want)
		}
	}
	out, err = runCmd(t, "models", "--json")
	var rows []modelInfo
	if err != nil || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 19 || rows[0].Source == "" {
		t.Errorf("models --json: %v %d rows", err, len(rows))
	}
}

// TestFlopsAbsurdTPSRefused (issue 17, defect 10): --tps 1e300 printed an
// MFU of 10^300 %; --tps must be in (0, 1e9] tokens/s per GPU when given
// (an explicit 0 is refused too), so every MFU printed is finite.
func TestFlopsAbsurdTPSRefused(t *testing.T) {
	for _, v := range []string{"1e300", "1.0000001e9", "0", "-3", "NaN", "Inf"} {
		for _, js := range []bool{false, true} {
			args := []string{"flops", "--model", "tiny", "--tps", v}
			if js {
				args = append(args, "--json")
			}
			out, err := runCmd(t, args...)
			if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "--tps = ") ||
				!strings.Contains(err.Error(), "must be in (0, 1e+09] tokens/s per GPU") {
				t.Errorf("--tps %s: exit %d, error %v\n%s", v, exitCode(err), err, out)
			}
		}
	}
	out, err := runCmd(t, "flops", "--model", "qwen3-235b-a22b", "--tps", "1e9", "--json")
	if err != nil {
		t.Fatalf("--tps 1e9 (the bound): %v", err)
	}
	var r report.Flops
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.HFU == nil || !(*r.HFU > 0) || math.IsInf(*r.HFU, 0) {
		t.Errorf("--tps 1e9: %v %+v", err, r.HFU)
	}
}

// TestIgnoredFlagsRefused (issue 17, defect 11): a flag accepted and then
// ignored is refused, naming the flag it needs: flops --gpu without --tps
// (no MFU is computed), bench --python without --torch.
func TestIgnoredFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"flops", "--model", "tiny", "--gpu", "h100"}, "--gpu = h100: used only with --tps"},
		{[]string{"bench", "--python", "/usr/bin/python3", "--no-layer", "--sizes", "8"}, "--python = /usr/bin/python3: used only with --torch"},
	} {
		_, err := runCmd(t, c.args...)
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: exit %d, error %v, want %q", c.args, exitCode(err), err, c.want)
		}
	}
}
