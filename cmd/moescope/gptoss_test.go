package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlanGPTOSS120B (issue 40): plan answers for GPT-OSS-120B on 64 H100s
// with a layout inside the memory target, and exports it to both torchtitan
// forms under torchtitan's gpt_oss names (gptoss_configs "120b" at v0.2.2,
// config_registry.gpt_oss_120b at b5bcd76c).
func TestPlanGPTOSS120B(t *testing.T) {
	dir := t.TempDir()
	toml, py := filepath.Join(dir, "g.toml"), filepath.Join(dir, "g.py")
	out, err := runCmd(t, "plan", "--model", "gpt-oss-120b", "--gpu", "h100", "--gpus", "64", "--seq", "4096", "--json",
		"--torchtitan-toml", toml, "--torchtitan-py", py)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var r struct {
		Best struct {
			TPS            float64 `json:"tps"`
			MemoryFraction float64 `json:"memory_fraction"`
		} `json:"best"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%.2000s", err, out)
	}
	if !(r.Best.TPS > 0) || !(r.Best.MemoryFraction > 0 && r.Best.MemoryFraction <= 0.92) {
		t.Errorf("best plan: TPS %v, memory fraction %v; want a positive TPS within the 0.92 target", r.Best.TPS, r.Best.MemoryFraction)
	}
	for file, want := range map[string]string{toml: `flavor = "120b"`, py: "from torchtitan.models.gpt_oss.config_registry import gpt_oss_120b"} {
		b, err := os.ReadFile(file)
		if err != nil || !strings.Contains(string(b), want) {
			t.Errorf("%s: %v; want it to contain %q", file, err, want)
		}
	}
}

// TestTrainRefusesGPTOSS: train's ranks do not run GPT-OSS's fields yet
// (numeric.New refuses them by name, while grad runs them: TestGradMatchesTorch).
func TestTrainRefusesGPTOSS(t *testing.T) {
	model := filepath.Join("..", "..", "testdata", "torchref", "gpt_oss", "config.json")
	out, err := runCmd(t, "train", "--model", model, "--lbs", "1", "--seq", "4", "--steps", "1", "--gpus", "1")
	if err == nil || !strings.Contains(err.Error(), "attn_sinks") || !strings.Contains(err.Error(), "fused_experts") {
		t.Errorf("train on gpt_oss: %v\n%s\nwant a refusal naming attn_sinks … fused_experts", err, out)
	}
}

// TestTrainRefusesLlama4: train's ranks do not run Llama 4's fields yet
// (numeric.New refuses them by name, while grad runs them: TestGradMatchesTorch).
func TestTrainRefusesLlama4(t *testing.T) {
	model := filepath.Join("..", "..", "testdata", "torchref", "llama4", "config.json")
	out, err := runCmd(t, "train", "--model", model, "--lbs", "1", "--seq", "4", "--steps", "1", "--gpus", "1")
	if err == nil || !strings.Contains(err.Error(), "chunk, no_rope, qk_norm l2_rope, attn_temperature, route_input, fused_halves") {
		t.Errorf("train on llama4: %v\n%s\nwant a refusal naming chunk … fused_halves", err, out)
	}
}
