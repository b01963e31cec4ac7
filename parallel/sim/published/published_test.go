package published

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// TestPublishedRuns predicts the peak reserved memory of every published
// run that reports it (parallel/sim/validate/testdata/published/, one file per source, each row
// citing its source) and prints the error. A BF16 run without
// torch.compile must be within 10%; compiled runs (whose fused loss and
// kernels save memory this eager model does not know about) are printed
// and flagged, not failed.
func TestPublishedRuns(t *testing.T) {
	runs, err := Load("../validate/testdata/published")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	bf16 := 0
	sources := map[string]bool{}
	for _, r := range runs {
		if r.PeakReservedBytes == nil {
			continue
		}
		cfg, err := r.LoadModel()
		if err != nil {
			t.Fatalf("%s: %v", r.File, err)
		}
		rep, err := memory.Estimate(cfg, r.Layout, r.Batch, memory.Options{AC: r.AC, LossChunks: r.LossChunks, OptimizerImpl: string(r.Optimizer)})
		if err != nil {
			t.Fatalf("%s: %v", r.File, err)
		}
		meas := float64(*r.PeakReservedBytes)
		e := float64(rep.Peak.Reserved)/meas - 1
		flag := "eager"
		if r.Compile {
			flag = "compiled (not failed)"
		}
		if r.Precision == "bf16" {
			bf16++
			sources[r.File] = true
		}
		rows = append(rows, fmt.Sprintf("%-14s %-5s %4d gpus ep %d %-9s lbs %2d seq %5d  measured %7.2f GiB  predicted %7.2f GiB (alloc %7.2f)  error %+6.1f%%  %s",
			cfg.Name, r.GPU, r.GPUs, r.EP, r.AC, r.LBS, r.Seq, meas/(1<<30), float64(rep.Peak.Reserved)/(1<<30),
			float64(rep.Peak.Allocated)/(1<<30), 100*e, flag))
		if r.Precision == "bf16" && !r.Compile && math.Abs(e) > 0.10 {
			t.Errorf("%s (%s): peak reserved predicted %d B, measured %d B: error %+.1f%% exceeds 10%%",
				r.File, r.Source, rep.Peak.Reserved, *r.PeakReservedBytes, 100*e)
		}
	}
	t.Log("peak reserved, prediction vs published measurement:\n" + strings.Join(rows, "\n"))
	if bf16 < 6 || len(sources) < 2 {
		t.Errorf("published BF16 rows with memory: %d from %d sources; want ≥ 6 from ≥ 2", bf16, len(sources))
	}
}

// TestPublishedNoDuplicates: no run is recorded twice across the files of
// parallel/sim/validate/testdata/published/ (Load refuses them; this names them), and
// CheckDuplicates catches both kinds.
func TestPublishedNoDuplicates(t *testing.T) {
	runs, err := Load("../validate/testdata/published")
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckDuplicates(runs); err != nil {
		t.Fatal(err)
	}
	base := Run{Model: "llama3-8b", GPU: "h100-96gb", Spec: testSpec(8, 8, 1, "selective", 2, 8192),
		Precision: "bf16", TPS: 5762, Source: "https://github.com/pytorch/torchtitan/blob/31a17bfdb70bab6f62a13d21816a5339b911d6e3/benchmarks/llama3_h100_202412_torchtitan.md (Table 1)",
		RunID: "R170", File: "a.json"}
	sameID := base
	sameID.LBS, sameID.File = 4, "b.json"
	// The same run cited at another commit, with other notes and a
	// rounded measurement, under no run_id.
	sameConfig := base
	sameConfig.Source = "https://github.com/pytorch/torchtitan/blob/b5bcd76c6/benchmarks/llama3_h100_202412_torchtitan.md"
	sameConfig.RunID, sameConfig.Notes, sameConfig.TPS, sameConfig.File = "", "again", 5760, "b.json"
	otherRun := base
	otherRun.RunID, otherRun.GPUs, otherRun.DPShard, otherRun.File = "R172", 128, 128, "b.json"
	// Load refuses a run recorded in two files.
	dir := t.TempDir()
	doc := `[{"model":"tiny","gpu":"b200","gpus":8,"dp_shard":8,"dp_replicate":1,"ep":1,"ac":"full","lbs":1,"seq":128,"precision":"bf16","tps":1000,"source":"x","run_id":"R1"}]`
	for _, f := range []string{"a.json", "b.json"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "run_id R1") {
		t.Errorf("a run in two files: Load error %v", err)
	}
	for name, c := range map[string]struct {
		runs []Run
		want string
	}{
		"same run_id":                 {[]Run{base, sameID}, "run_id R170: in a.json and in b.json"},
		"same configuration, source":  {[]Run{base, sameConfig}, "the same configuration from the same source"},
		"different runs of one table": {[]Run{base, otherRun}, ""},
	} {
		err := CheckDuplicates(c.runs)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want %q", name, err, c.want)
		}
	}
}

func TestReadRunsRejects(t *testing.T) {
	good := `{"model":"tiny","gpu":"b200","gpus":8,"dp_shard":8,"dp_replicate":1,"ep":1,"ac":"full","lbs":1,"seq":128,"precision":"bf16","tps":1000,"source":"x"}`
	if _, err := ReadRuns(strings.NewReader("["+good+"]"), "good", true); err != nil {
		t.Fatalf("valid run rejected: %v", err)
	}
	for name, doc := range map[string]string{
		"unknown field":  strings.Replace(good, `"tps"`, `"tpz"`, 1),
		"no source":      strings.Replace(good, `"source":"x"`, `"source":""`, 1),
		"bad ac":         strings.Replace(good, `"full"`, `"most"`, 1),
		"lbs 0":          strings.Replace(good, `"lbs":1`, `"lbs":0`, 1),
		"layout":         strings.Replace(good, `"dp_shard":8`, `"dp_shard":3`, 1),
		"ep ∤ dp_shard":  strings.Replace(good, `"ep":1`, `"ep":3`, 1),
		"mfu in percent": strings.Replace(good, `"tps":1000`, `"tps":1000,"mfu":39.4`, 1),
		"allocated 0":    strings.Replace(good, `"tps":1000`, `"tps":1000,"peak_allocated_bytes":0`, 1),
		"no precision":   strings.Replace(good, `"precision":"bf16",`, ``, 1),
		"mtp":            strings.Replace(good, `"tps":1000`, `"tps":1000,"mtp":true`, 1),
		"not an array":   good,
	} {
		doc := doc
		if name != "not an array" {
			doc = "[" + doc + "]"
		}
		if _, err := ReadRuns(strings.NewReader(doc), name, true); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A run trained without MTP modules may say so.
	if _, err := ReadRuns(strings.NewReader("["+strings.Replace(good, `"tps":1000`, `"tps":1000,"mtp":false`, 1)+"]"), "no mtp", true); err != nil {
		t.Errorf("mtp false rejected: %v", err)
	}
	// Calibration input may omit the source.
	noSrc := strings.Replace(good, `"source":"x",`, ``, 1)
	noSrc = strings.Replace(noSrc, `,"source":"x"`, ``, 1)
	if _, err := ReadRuns(strings.NewReader("["+noSrc+"]"), "calib", false); err != nil {
		t.Errorf("run without source rejected for calibration: %v", err)
	}
}

// endless is a reader that never ends (like /dev/zero, which calibrate
// --runs once read until memory ran out).
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = ' '
	}
	return len(p), nil
}

func TestReadRunsBounded(t *testing.T) {
	if _, err := ReadRuns(endless{}, "endless", false); err == nil || !strings.Contains(err.Error(), "larger than 16777216 bytes") {
		t.Errorf("endless input: %v", err)
	}
}

// FuzzReadRuns: the published-runs parser never panics, and what it
// accepts validates.
func FuzzReadRuns(f *testing.F) {
	f.Add([]byte(`[{"model":"tiny","gpu":"b200","gpus":8,"dp_shard":8,"dp_replicate":1,"ep":1,"ac":"full","lbs":1,"seq":128,"precision":"bf16","tps":1000,"source":"x"}]`))
	f.Add([]byte(`[{"model":"m","gpu":"h100","gpus":16,"dp_shard":8,"dp_replicate":2,"ep":4,"ac":"layer:2","lbs":2,"seq":8,"precision":"bf16","tps":1,"source":"s","peak_reserved_bytes":5,"compile":true}]`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, data []byte) {
		runs, err := ReadRuns(bytes.NewReader(data), "fuzz", true)
		if err != nil {
			return
		}
		for _, r := range runs {
			if err := r.Validate(true); err != nil {
				t.Fatalf("accepted an invalid run: %v", err)
			}
		}
	})
}

// baseRunJSON is a valid run's required keys; readRun adds keys to it
// (a key given twice takes its last value).
const baseRunJSON = `"model":"tiny","gpu":"b200","gpus":1,"dp_shard":1,"dp_replicate":1,"ep":1,"ac":"full","lbs":1,"seq":8,"precision":"bf16","tps":1,"source":"test"`

// readRun reads one run of baseRunJSON and extra keys with ReadRuns.
func readRun(extra string) (Run, error) {
	obj := "{" + baseRunJSON
	if extra != "" {
		obj += "," + extra
	}
	runs, err := ReadRuns(strings.NewReader("["+obj+"}]"), "test", true)
	if len(runs) != 1 {
		return Run{}, err
	}
	return runs[0], err
}

// TestRunMemoryOptions: what a run's optional memory keys mean (the
// schema's documented defaults), and that bad values name their key.
func TestRunMemoryOptions(t *testing.T) {
	cases := []struct {
		name   string
		extra  string
		want   func(memory.Options) bool
		errSub string
	}{
		{"absent: compiled, expandable, f32 state", "", func(o memory.Options) bool {
			return o.Compile == memory.Compiled && o.Segments == memory.Expandable && o.Precision == moe.DefaultPrecision
		}, ""},
		{"compile false", `"compile":false`, func(o memory.Options) bool { return o.Compile == memory.Compile{} }, ""},
		{"model only", `"compile":true,"compile_components":["model"]`,
			func(o memory.Options) bool { return o.Compile == memory.Compile{Model: true} }, ""},
		{"fixed segments", `"expandable_segments":false`, func(o memory.Options) bool { return o.Segments == memory.Fixed }, ""},
		{"bf16 state and loss", `"param_dtype":"bf16","grad_dtype":"bf16","optimizer_dtype":"bf16","loss_dtype":"bf16"`,
			func(o memory.Options) bool {
				return o.Precision.Param == moe.BF16 && o.Precision.Grad == moe.BF16 && o.Precision.Optimizer == moe.BF16 && o.LossDType == moe.BF16
			}, ""},
		{"bad component", `"compile_components":["optimizer"]`, nil, "compile_components"},
		{"bad param type", `"param_dtype":"fp8"`, nil, "param_dtype"},
		{"bad loss type", `"loss_dtype":"i64"`, nil, "loss_dtype"},
	}
	for _, c := range cases {
		r, err := readRun(c.extra)
		if c.errSub != "" {
			if err == nil || !strings.Contains(err.Error(), c.errSub) {
				t.Errorf("%s: err = %v, want one naming %s", c.name, err, c.errSub)
			}
			continue
		}
		if o := memory.OptionsOf(r.Recipe, r.AC); err != nil || !c.want(o) {
			t.Errorf("%s: options %+v, err %v", c.name, o, err)
		}
	}
}

// TestRunDefaults: a key left out keeps the schema's documented default
// (reshard_after_forward: off under pp > 1 unless stated); a key the
// schema does not have is refused; a free-text precision loads and is
// refused only by a prediction, naming the key.
func TestRunDefaults(t *testing.T) {
	r, err := readRun("")
	if err != nil {
		t.Fatal(err)
	}
	if !r.Compile || !r.ExpandableSegments || !r.ReshardAfterForward || r.GradAccum != 1 || r.TP != 1 || r.ETP != 1 ||
		r.Sharding != job.ShardFSDP || r.ReduceDType != r.GradDType || r.Optimizer != job.FusedAdamW || r.Attention != job.CuDNNAttention ||
		r.Dispatcher != job.AllToAll || r.ExpertGEMM != job.GroupedMM {
		t.Errorf("defaults: %+v", r.Spec)
	}
	if r, err := readRun(`"grad_dtype":"bf16"`); err != nil || r.ReduceDType != moe.BF16 {
		t.Errorf("reduce_dtype absent = grad_dtype: %q, %v", r.ReduceDType, err)
	}
	for _, c := range []struct {
		extra string
		want  bool
	}{
		{`"gpus":2,"pp":2`, false},
		{`"gpus":2,"pp":2,"reshard_after_forward":true`, true},
		{`"reshard_after_forward":false`, false},
	} {
		if r, err := readRun(c.extra); err != nil || r.ReshardAfterForward != c.want {
			t.Errorf("%s: reshard_after_forward = %v, %v; want %v", c.extra, r.ReshardAfterForward, err, c.want)
		}
	}
	if _, err := readRun(`"bogus":1`); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("unknown key: %v", err)
	}
	for _, key := range []string{"gpus", "ac", "lbs", "tps"} {
		obj := strings.Replace("{"+baseRunJSON+"}", `"`+key+`":`, `"unused_`+key+`":`, 1)
		if _, err := ReadRuns(strings.NewReader("["+obj+"]"), "test", true); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s left out: %v", key, err)
		}
	}
	// A table's spelling of a priced recipe reads as it; an ambiguous one
	// is refused, naming the field.
	for text, want := range map[string]string{"MXFP8 (params)": "", "FP8-CS": "", "NVFP4": "", "FP8 (fine-grained 1x128/128x128)": "", "FP8": "published spelling"} {
		r, err = readRun(`"precision":"` + text + `"`)
		if err != nil {
			t.Fatalf("precision %q: %v", text, err)
		}
		_, err := InputForRun(r)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), "precision") || !strings.Contains(err.Error(), want)) {
			t.Errorf("precision %q: InputForRun = %v, want %q", text, err, want)
		}
	}
}

// TestPrecisionRecipe: the validation table's precision spellings (every
// distinct value of published_runs.csv's precision column in 2026-12, by
// hand) map to DESIGN's recipes.
func TestPrecisionRecipe(t *testing.T) {
	for text, want := range map[string]job.Precision{
		"MXFP8": job.MXFP8, "BF16": job.BF16, "BF16 baseline": job.BF16, "FP8-CS": job.FP8Current,
		"FP8 (table has no precision column; FP8 per-tensor current scaling presumed)": job.FP8Current,
		"FP8 (current scaling per recipe naming)":                                      job.FP8Current,
		"FP8 per-tensor current scaling (page header)":                                 job.FP8Current,
		"FP8 tensorwise": job.FP8Tensorwise, "FP8 tensorwise (Float8 on nn.Linear)": job.FP8Tensorwise,
		"MXFP8 (parenthesised value)": job.MXFP8, "MXFP8 on expert GEMMs only (TE); rest BF16": job.MXFP8,
		"MXFP8 (likely)": job.MXFP8, "NVFP4": job.NVFP4, "FP8 (fine-grained 1x128/128x128)": job.FP8Blockwise,
		"fp8-current": job.FP8Current, "mxfp8": job.MXFP8, "FP8 rowwise": job.FP8Rowwise, "FP8 delayed scaling": job.FP8Delayed,
	} {
		got, err := Run{Precision: text}.PrecisionRecipe()
		if err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", text, got, err, want)
		}
	}
}

// TestRunFrameworkFields: the runs schema's framework keys reach the
// simulator's input, and a value outside each key's list is refused by
// ReadRuns and by InputForRun, naming the key.
func TestRunFrameworkFields(t *testing.T) {
	r, err := readRun(`"torch_version":"2.6.0","dispatcher":"hybridep","expert_gemm":"cublas","fused_elementwise":true`)
	if err != nil {
		t.Fatal(err)
	}
	in, err := InputForRun(r)
	if err != nil {
		t.Fatal(err)
	}
	if in.Torch != (job.TorchVersion{Major: 2, Minor: 6}) || in.Dispatcher != job.HybridEP || in.ExpertGEMM != job.CuBLASExperts || !in.FusedElementwise {
		t.Errorf("input %+v %q %q %v", in.Torch, in.Dispatcher, in.ExpertGEMM, in.FusedElementwise)
	}
	for field, extra := range map[string]string{
		"torch_version": `"torch_version":"latest"`,
		"dispatcher":    `"dispatcher":"nccl"`,
		"expert_gemm":   `"expert_gemm":"triton"`,
	} {
		if _, err := readRun(extra); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: ReadRuns = %v, want one naming it", field, err)
		}
	}
	base, err := readRun("")
	if err != nil {
		t.Fatal(err)
	}
	for field, edit := range map[string]func(*Run){
		"dispatcher":  func(r *Run) { r.Dispatcher = "nccl" },
		"expert_gemm": func(r *Run) { r.ExpertGEMM = "triton" },
	} {
		r := base
		edit(&r)
		if err := r.Validate(true); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: Validate = %v, want one naming it", field, err)
		}
		if _, err := InputForRun(r); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: InputForRun = %v, want one naming it", field, err)
		}
	}
	// A run on GPUs below their default power limit, the limit unstated,
	// has no step time the model can price; its memory options stand.
	r, err = readRun(`"power_limited":true`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := InputForRun(r); err == nil || !strings.Contains(err.Error(), "power_limited") {
		t.Errorf("power_limited: InputForRun = %v, want a refusal naming the field", err)
	}
}

// TestRunACModules: the published-runs schema's ac takes the modules
// policy (Megatron-Core runs' "selective: norm, act" is
// modules:layernorm,moe_act) and refuses a module that is not built,
// naming it.
func TestRunACModules(t *testing.T) {
	for _, ac := range []string{"modules:layernorm,moe_act", "modules:layernorm,moe"} { // R145's --recompute-modules layernorm moe
		if _, err := readRun(`"ac":"` + ac + `"`); err != nil {
			t.Errorf("%s: %v", ac, err)
		}
	}
	if _, err := readRun(`"ac":"modules:core_attn"`); err == nil || !strings.Contains(err.Error(), `"core_attn" is not built`) {
		t.Errorf("modules:core_attn: %v", err)
	}
}

// testSpec is a run's description over the schema's defaults: gpus,
// dp_shard, ep (dp_replicate 1), the checkpointing policy and the batch.
func testSpec(gpus, dpShard, ep int, ac string, lbs, seq int) job.Spec {
	s := Defaults()
	s.GPUs, s.DPShard, s.DPReplicate, s.EP, s.LBS, s.Seq = gpus, dpShard, 1, ep, lbs, seq
	var err error
	if s.AC, err = moe.ParseAC(ac); err != nil {
		panic(err)
	}
	return s
}
