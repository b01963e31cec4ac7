package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

func runMem(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(&out, &errb, append([]string{"memory"}, args...))
	return out.String() + errb.String(), err
}

func TestMemoryJSON(t *testing.T) {
	out, err := runMem(t, "--model", "qwen3-30b-a3b", "--gpu", "b200", "--gpus", "16", "--ep", "8",
		"--ac", "selective", "--lbs", "2", "--seq", "4096", "--json", "--max-lbs")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var r struct {
		PeakAllocated *int64           `json:"peak_allocated_bytes"`
		PeakReserved  *int64           `json:"peak_reserved_bytes"`
		Device        *int64           `json:"device_bytes"`
		Fraction      *float64         `json:"memory_fraction"`
		Breakdown     map[string]int64 `json:"breakdown"`
		MaxLBS        *int             `json:"max_lbs"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r.PeakAllocated == nil || r.PeakReserved == nil || r.Device == nil || r.Fraction == nil || r.MaxLBS == nil || len(r.Breakdown) == 0 {
		t.Fatalf("missing fields:\n%s", out)
	}
	dev, _ := hw.LookupDevice("b200")
	if *r.Device != dev.MemoryBytes {
		t.Errorf("device_bytes %d, registry says %d", *r.Device, dev.MemoryBytes)
	}
	if got := float64(*r.PeakReserved) / float64(*r.Device); got != *r.Fraction {
		t.Errorf("memory_fraction %v ≠ reserved/device %v", *r.Fraction, got)
	}
	var live int64
	for k, v := range r.Breakdown {
		if k != "allocator_overhead" {
			live += v
		}
	}
	if live != *r.PeakAllocated || live+r.Breakdown["allocator_overhead"] != *r.PeakReserved {
		t.Errorf("breakdown sums to %d (+%d overhead); peaks %d, %d", live, r.Breakdown["allocator_overhead"], *r.PeakAllocated, *r.PeakReserved)
	}
	if *r.MaxLBS < 2 {
		t.Errorf("max_lbs = %d; lbs 2 uses %.0f%% of a B200", *r.MaxLBS, 100**r.Fraction)
	}
}

func TestMemoryText(t *testing.T) {
	out, err := runMem(t, "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--lbs", "1", "--seq", "2048")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"peak reserved", "memory fraction", "gathered_weights", "allocator_overhead"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestMemoryBadInput(t *testing.T) {
	base := []string{"--model", "qwen3-30b-a3b", "--seq", "4096"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--gpus", "8", "--lbs", "0"}, "--lbs"},
		{[]string{"--gpus", "8", "--lbs", "1", "--gpu", "tpu9"}, "known: b200"},
		{[]string{"--gpus", "8", "--ep", "3", "--lbs", "1"}, "does not divide"},
		{[]string{"--gpus", "8", "--dp-shard", "3", "--dp-replicate", "2", "--lbs", "1"}, "gpus"},
		{[]string{"--gpus", "16", "--ep", "16", "--lbs", "1", "--model", "mixtral-8x7b"}, "experts"},
		{[]string{"--gpus", "8", "--lbs", "1", "--ac", "some"}, "--ac"},
		{[]string{"--gpus", "8", "--lbs", "1", "--max-lbs", "--memory-target", "1.5"}, "memory-target"},
		// --memory-target is checked with or without --max-lbs, and NaN
		// fails every comparison, so it must be rejected explicitly.
		{[]string{"--gpus", "8", "--lbs", "1", "--memory-target", "5"}, "memory-target"},
		{[]string{"--gpus", "8", "--max-lbs", "--memory-target", "NaN"}, "memory-target"},
		{[]string{"--gpus", "8", "--max-lbs", "--memory-target", "0"}, "memory-target"},
		// 0 is not "the default": the report would print grad-accum 0.
		{[]string{"--gpus", "8", "--lbs", "1", "--grad-accum", "0"}, "--grad-accum"},
		{[]string{"--gpus", "8", "--lbs", "1", "--grad-dtype", "f8"}, "grad-dtype"},
		{[]string{"--gpus", "8", "--lbs", "1", "--model", ""}, "--model is required (a config.json path or one of: deepseek-moe-16b"},
		{[]string{"--gpus", "8", "--lbs", "1", "--model", "gpt5"}, `--model: model "gpt5" is neither a built-in`},
		{[]string{"--gpus", "8", "--lbs", "1", "--attention", "sparse"}, "attention"},
		{[]string{"--gpus", "8", "--lbs", "1", "--optimizer-impl", "lion"}, "optimizer"},
		{[]string{"--gpus", "8", "--lbs", "1", "--cuda-graphs", "some"}, "--cuda-graphs"},
		// DeepEP (92fe2de) recommends no config for 256 ranks: its Buffer cannot be sized.
		{[]string{"--gpus", "256", "--ep", "256", "--lbs", "1", "--dispatcher", "deepep", "--model", "deepseek-v3"}, "dispatcher deepep with ep = 256"},
	} {
		out, err := runMem(t, append(append([]string{}, base...), c.args...)...)
		if err == nil || exitCode(err) == 0 {
			t.Errorf("%v: accepted\n%s", c.args, out)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %q does not mention %q", c.args, err, c.want)
		}
	}
}

// TestMemoryCompileFlags: --compile=false (eager), fixed segments and CUDA
// graphs are what they say, the JSON records the settings, and a bad --loss-dtype is
// refused naming the flag.
func TestMemoryCompileFlags(t *testing.T) {
	peak := func(extra ...string) (reserved, allocated int64, compiled, expandable bool) {
		t.Helper()
		args := append([]string{"--model", "llama3-8b", "--gpus", "8", "--lbs", "2", "--seq", "4096", "--json"}, extra...)
		out, err := runMem(t, args...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var r struct {
			Reserved   int64           `json:"peak_reserved_bytes"`
			Allocated  int64           `json:"peak_allocated_bytes"`
			Compile    map[string]bool `json:"compile"`
			Expandable bool            `json:"expandable_segments"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		return r.Reserved, r.Allocated, r.Compile["model"] && r.Compile["loss"], r.Expandable
	}
	_, aDef, cDef, eDef := peak()
	_, aEager, cEager, _ := peak("--compile=false")
	_, _, _, eFixed := peak("--expandable-segments=false")
	if !cDef || !eDef || cEager || eFixed {
		t.Errorf("settings: default compile %v expandable %v; --compile=false %v; --expandable-segments=false %v", cDef, eDef, cEager, eFixed)
	}
	// Eager, the loss holds 12 bytes per logit at its peak, compiled 4
	// (memory's TestLossBytesPerLogit): 8 × 8192 tokens × 128256 more.
	if want := int64(8) * 8192 * 128256; aEager-aDef < want {
		t.Errorf("eager peak %d − compiled %d = %d, want ≥ %d (the loss alone)", aEager, aDef, aEager-aDef, want)
	}
	// CUDA graphs' static buffers, by hand (memory/graphs.go): full graphs
	// keep the int64 ids and labels of 2 × 4096 tokens, 16 × 8192 =
	// 131,072 B; per-layer graphs one bf16 block input and one output
	// gradient of 8192 × 4096, 2 × 8192 × 4096 × 2 = 134,217,728 B.
	rFull, aFull, _, _ := peak("--cuda-graphs", "full")
	rLayers, aLayers, _, _ := peak("--cuda-graphs", "layers")
	rDef, _, _, _ := peak()
	if aFull-aDef != 131072 || aLayers-aDef != 134217728 || rFull < rDef || rLayers < rDef {
		t.Errorf("cuda graphs: allocated +%d (full), +%d (layers), want +131,072 and +134,217,728; reserved %d, %d over %d",
			aFull-aDef, aLayers-aDef, rFull, rLayers, rDef)
	}
	if out, err := runMem(t, "--model", "llama3-8b", "--gpus", "8", "--lbs", "2", "--seq", "4096", "--loss-dtype", "f8"); err == nil ||
		!strings.Contains(out+err.Error(), "--loss-dtype") {
		t.Errorf("--loss-dtype f8: err %v\n%s", err, out)
	}
}

// TestMemoryGradSyncLastOnly: KempnerForge's 4 × H200 Llama-3-8B run
// (parallel/sim/validate/testdata/published/kempnerforge-mfu-scaling-h200.json) with
// --grad-sync-last-only and fp32 reduction holds every parameter's
// unsharded gradient in fp32 at the peak (the second micro-step's loss).
// Llama-3-8B by hand: embedding and LM head 128256·4096 = 525,336,576
// each; per layer q and o 4096², k and v 1024·4096, the MLP 3·4096·14336,
// two norms of 4096: 218,112,000, × 32 layers; final norm 4096; Ψ =
// 8,030,261,248, × 4 B = 32,121,044,992 B. The flag is refused with zero1.
func TestMemoryGradSyncLastOnly(t *testing.T) {
	args := []string{"--model", "llama3-8b", "--gpu", "h200", "--gpus", "4", "--ac", "full", "--lbs", "4", "--seq", "4096",
		"--grad-accum", "2", "--grad-dtype", "bf16", "--optimizer-dtype", "bf16", "--reduce-dtype", "f32", "--json"}
	var r struct {
		Layout    job.Layout       `json:"layout"`
		Breakdown map[string]int64 `json:"breakdown"`
	}
	out, err := runMem(t, append(args, "--grad-sync-last-only")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	const psi = 525336576*2 + 218112000*32 + 4096
	if !r.Layout.GradSyncLastOnly || r.Breakdown["unsharded_grads"] != psi*4 {
		t.Errorf("layout %+v, unsharded_grads at the peak %d B, want %d", r.Layout, r.Breakdown["unsharded_grads"], int64(psi*4))
	}
	out, err = runMem(t, append(args, "--grad-sync-last-only", "--sharding", "zero2")...)
	if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "grad_sync_last_only") {
		t.Errorf("zero2: exit %d, error %v\n%s", exitCode(err), err, out)
	}
}

// TestMemoryMaxLBSPipelineMicrobatch: --max-lbs without --lbs searches from
// the layout's smallest local batch, so pipeline micro-batches of 2 (where
// lbs 1 is not a batch the layout runs) are searched, not refused.
func TestMemoryMaxLBSPipelineMicrobatch(t *testing.T) {
	out, err := runMem(t, "--model", "tiny", "--gpus", "4", "--pp", "2", "--seq", "64", "--max-lbs", "--pp-microbatch-size", "2", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var r struct {
		MaxLBS *int `json:"max_lbs"`
	}
	if json.Unmarshal([]byte(out), &r) != nil || r.MaxLBS == nil || *r.MaxLBS < 2 || *r.MaxLBS%2 != 0 {
		t.Errorf("max_lbs %v; want a multiple of the micro-batch size 2\n%s", r.MaxLBS, out)
	}
}

// TestMemoryExpertSkew: --expert-skew gives the most loaded expert-parallel
// rank's memory, more than balanced routing's, and a skew the layout cannot
// produce (above ep·min(k, E/ep)/k = 8 for Qwen3-30B-A3B's top-8 of 128
// experts on ep 8) is refused naming the bound. --routing FILE sizes the
// rank its counts load most: 16 experts per rank, rank 0's at 150 rows and
// the other 112 at 100, hold 2400 of 13600 rows, 2400 ÷ (13600/8) =
// 24/17× the mean (by hand), the memory of --expert-skew 24/17; --routing
// learned holds more than balanced routing.
func TestMemoryExpertSkew(t *testing.T) {
	args := []string{"--model", "qwen3-30b-a3b", "--gpus", "8", "--ep", "8", "--lbs", "2", "--seq", "4096", "--ac", "none", "--json"}
	peak := func(extra ...string) int64 {
		out, err := runMem(t, append(append([]string{}, args...), extra...)...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", extra, err, out)
		}
		var r struct {
			Peak int64 `json:"peak_reserved_bytes"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil || r.Peak <= 0 {
			t.Fatalf("%v: %v\n%s", extra, err, out)
		}
		return r.Peak
	}
	if balanced, skewed := peak(), peak("--expert-skew", "1.5"); !(skewed > balanced) {
		t.Errorf("peak reserved at skew 1.5: %d B, balanced %d B: want more", skewed, balanced)
	}
	if out, err := runMem(t, append(append([]string{}, args...), "--expert-skew", "9")...); err == nil || !strings.Contains(err.Error(), "[1, 8]") {
		t.Errorf("skew 9 on ep 8: error %v, want one naming [1, 8]\n%s", err, out)
	}
	row := make([]int64, 128)
	for e := range row {
		row[e] = 100
		if e < 16 {
			row[e] = 150
		}
	}
	b, _ := json.Marshal(map[string]any{"expert_counts": [][]int64{row}})
	counts := filepath.Join(t.TempDir(), "counts.json")
	if err := os.WriteFile(counts, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if file, skew := peak("--routing", counts), peak("--expert-skew", strconv.FormatFloat(24.0/17, 'g', -1, 64)); file != skew {
		t.Errorf("--routing FILE: peak reserved %d B, want that of skew 24/17: %d B", file, skew)
	}
	if balanced, learned := peak(), peak("--routing", "learned"); !(learned > balanced) {
		t.Errorf("--routing learned: peak reserved %d B, want more than balanced %d B", learned, balanced)
	}
}
