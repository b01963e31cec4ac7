package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlanLlama4Scout: issue 41's question answers with a plan within the
// memory target, exported as torchtitan v0.2.2's llama4 17bx16e_irope; the
// export for torchtitan main, which has no Llama 4, is refused by name.
func TestPlanLlama4Scout(t *testing.T) {
	dir := t.TempDir()
	toml := filepath.Join(dir, "s.toml")
	out, err := runCmd(t, "plan", "--model", "llama-4-scout", "--gpu", "b200", "--gpus", "64", "--seq", "8192", "--json",
		"--torchtitan-toml", toml)
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
	if b, err := os.ReadFile(toml); err != nil || !strings.Contains(string(b), `flavor = "17bx16e_irope"`) {
		t.Errorf("%s: %v; want the 17bx16e_irope flavor", toml, err)
	}
	out, err = runCmd(t, "plan", "--model", "llama-4-scout", "--gpu", "b200", "--gpus", "64", "--seq", "8192",
		"--torchtitan-py", filepath.Join(dir, "s.py"))
	if err == nil || !strings.Contains(err.Error()+out, "has no Llama 4") {
		t.Errorf("--torchtitan-py: %v\n%s; want a refusal naming Llama 4", err, out)
	}
}
