package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moescope/moescope/internal/golden"

	"github.com/BurntSushi/toml"
	"github.com/moescope/moescope/cmd/moescope/internal/report"
	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/plan"
	"github.com/moescope/moescope/parallel/sim"
)

// planFake is a closed-form evaluator for the command's golden tests, so
// they test the command (flags, table, JSON, exports, errors), not the
// performance model. Memory: 16 bytes per parameter sharded over dp_shard
// (ZeRO modes keep 6 or 10 bytes unsharded, DDP 18), plus activations of
// 2·4096·hidden·layers bytes per sequence scaled by the policy (none 1,
// selective 0.5, full 0.1), over the device's memory. TPS: 40,000 · lbs /
// (lbs + 2) per GPU, less 3% per doubling of dp_shard beyond 8, 1% per
// doubling of replicas and 2% per doubling of ep, times 0.9 under full and
// 0.97 under selective checkpointing.
type planFake struct {
	params, perSeqBytes, capacity float64
}

func newPlanFake(sim *plan.SimEvaluator) plan.Evaluator {
	c := sim.Run.Model
	n := 0.0
	for _, p := range c.Params() {
		k := 1.0
		for _, d := range p.Shape {
			k *= float64(d)
		}
		n += k
	}
	return &planFake{params: n, perSeqBytes: 2 * 4096 * float64(c.Hidden*c.Layers), capacity: float64(sim.Device.MemoryBytes)}
}

func planLog2(n int) float64 {
	k := 0.0
	for n > 1 {
		n /= 2
		k++
	}
	return k
}

func (f *planFake) MemoryFraction(p plan.Point) (float64, error) {
	l := p.Layout
	s := float64(l.DPShard)
	state := map[job.Sharding]float64{job.ShardFSDP: 16 / s, job.ShardZeRO2: 6 + 10/s, job.ShardZeRO1: 10 + 6/s, job.ShardDDP: 18}[l.Sharding] * f.params
	if !l.ReshardAfterForward || l.KeepGathered {
		state += 2 * f.params / float64(l.EP)
	}
	act := map[moe.ACMode]float64{moe.ACNone: 1, moe.ACSelective: 0.5, moe.ACFull: 0.1}[p.AC.Mode] * f.perSeqBytes * float64(p.LBS)
	return (state + act) / f.capacity, nil
}

func (f *planFake) Evaluate(p plan.Point) (plan.Score, error) {
	m, _ := f.MemoryFraction(p)
	l := p.Layout
	tps := 40000 * float64(p.LBS) / float64(p.LBS+2)
	tps *= 1 - 0.03*max(0, planLog2(l.DPShard)-3) - 0.01*planLog2(l.DPReplicate) - 0.02*planLog2(l.EP)
	tps *= map[moe.ACMode]float64{moe.ACNone: 1, moe.ACSelective: 0.97, moe.ACFull: 0.9}[p.AC.Mode]
	if !l.ReshardAfterForward {
		tps *= 1.01
	}
	step := float64(p.LBS*p.GradAccum*4096) / tps
	return plan.Score{TPS: tps, MFU: tps / 100000, MemoryFraction: m, StepTimeS: step, Bottleneck: "compute",
		Breakdown: sim.Breakdown{ComputeS: 0.8 * step, ExposedCommS: map[string]float64{"all_gather": 0.2 * step},
			CommS: map[string]float64{"all_gather": 0.5 * step}, ComputeByClassS: map[string]float64{"gemm": 0.8 * step}}}, nil
}

func planRun(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	old := planEvaluator
	planEvaluator = newPlanFake
	defer func() { planEvaluator = old }()
	var out, errb bytes.Buffer
	// The knobs' table re-predicts the best plan with the real evaluator:
	// it has no meaning beside the fake's plans.
	err := run(&out, &errb, append([]string{"plan", "--knobs=false"}, args...))
	return out.String(), errb.String(), err
}

// planTextAndJSON runs plan with the real evaluator twice, for its text
// and its --json report.
func planTextAndJSON(t *testing.T, args ...string) (string, planReportJSON) {
	t.Helper()
	var out, errb bytes.Buffer
	if err := run(&out, &errb, append([]string{"plan"}, args...)); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	out.Reset()
	if err := run(&out, &errb, append([]string{"plan", "--json"}, args...)); err != nil {
		t.Fatal(err)
	}
	var rep planReportJSON
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	return text, rep
}

func TestPlanCommandGolden(t *testing.T) {
	args := []string{"--model", "qwen3-30b-a3b", "--gpu", "b200", "--gpus", "64", "--seq", "4096", "--global-batch", "512", "--top", "5"}
	out, _, err := planRun(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "plan_table.txt", []byte(out))

	js, _, err := planRun(t, append(args, "--json")...)
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "plan.json", []byte(js))
	var rep map[string]any
	if err := json.Unmarshal([]byte(js), &rep); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"stages", "plans", "best"} {
		if _, ok := rep[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	best := rep["best"].(map[string]any)
	for _, k := range []string{"gpus", "dp_shard", "dp_replicate", "ep", "sharding", "reshard_after_forward", "keep_gathered",
		"allreduce_last_only", "ac", "lbs", "grad_accum", "tps", "mfu", "memory_fraction", "step_time_s"} {
		if _, ok := best[k]; !ok {
			t.Errorf("best plan lacks %q", k)
		}
	}
	// global batch = lbs × dp_replicate × dp_shard × grad_accum (DESIGN).
	if g := best["lbs"].(float64) * best["dp_replicate"].(float64) * best["dp_shard"].(float64) * best["grad_accum"].(float64); g != 512 {
		t.Errorf("best plan's global batch %v, want 512", g)
	}
	// 512 sequences × 4096 tokens.
	if tok := best["tokens_per_step"]; tok != 2097152.0 {
		t.Errorf("best plan's tokens_per_step %v, want 2097152", tok)
	}
	// The batch is held: no note suggests --global-batch.
	if strings.Contains(out, "set --global-batch") {
		t.Errorf("the table suggests --global-batch though it was given:\n%s", out)
	}
}

// TestPlanFreeBatchNote: with --global-batch left free the best line and a
// note say what the best plan steps. The fake's TPS rises with lbs and, at
// 64 GPUs, is highest at dp_shard 8 (no penalty below 9) × 8 replicas
// (−3%), no-reshard (+1%); --max-lbs 8 --ac none (67.1% of memory, as in
// plan_table.txt) makes it lbs 8: 8 × 64 = 512 sequences of 4096 tokens,
// 2,097,152 tokens (2.1M).
func TestPlanFreeBatchNote(t *testing.T) {
	out, _, err := planRun(t, "--model", "qwen3-30b-a3b", "--gpus", "64", "--seq", "4096", "--max-lbs", "8", "--ac", "none")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		"best: fsdp groups of 8 GPUs × 8 replicas (no-reshard), no activation checkpointing, lbs 8 (global batch 512 sequences, 2.1M tokens per step): ",
		"\nnote: the best plan steps 512 sequences (2.1M tokens) per step; set --global-batch to hold the batch your recipe trains with.\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("table lacks %q:\n%s", w, out)
		}
	}
}

func TestPlanCommandExports(t *testing.T) {
	dir := t.TempDir()
	tomlPath, pyPath, plotDir := filepath.Join(dir, "job.toml"), filepath.Join(dir, "job.py"), filepath.Join(dir, "plots")
	args := []string{"--model", "qwen3-30b-a3b", "--gpus", "64", "--seq", "4096", "--global-batch", "512",
		"--torchtitan-toml", tomlPath, "--torchtitan-py", pyPath, "--plot", plotDir}
	out, stderr, err := planRun(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	// One "wrote FILE" line per file, and the narrowing said with its reasons.
	wrote := append([]string{tomlPath, pyPath}, report.PlotPaths(plotDir)...)
	for _, p := range wrote {
		if !strings.Contains(stderr, "wrote "+p+"\n") && !strings.Contains(stderr, "wrote "+p+" (") {
			t.Errorf("stderr lacks \"wrote %s\":\n%s", p, stderr)
		}
	}
	if n := strings.Count(stderr, "wrote "); n != len(wrote) {
		t.Errorf("%d \"wrote\" lines, want %d:\n%s", n, len(wrote), stderr)
	}
	for _, w := range []string{"--torchtitan-toml and --torchtitan-py narrow the search", "× sharding = zero1: ", "× sharding = zero2: "} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr)
		}
	}
	b, err := os.ReadFile(tomlPath)
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "plan_cli.toml", b)
	var doc struct {
		Parallelism struct {
			Rep     int    `toml:"data_parallel_replicate_degree"`
			Shard   int    `toml:"data_parallel_shard_degree"`
			EP      int    `toml:"expert_parallel_degree"`
			Reshard string `toml:"fsdp_reshard_after_forward"`
		} `toml:"parallelism"`
		Training struct {
			LBS    int `toml:"local_batch_size"`
			Global int `toml:"global_batch_size"`
			Seq    int `toml:"seq_len"`
		} `toml:"training"`
	}
	if _, err := toml.Decode(string(b), &doc); err != nil {
		t.Fatalf("exported TOML does not parse: %v", err)
	}
	// The table's first row is the best plan: its degrees must round-trip.
	var row []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[0] == "1" {
			row = f
		}
	}
	if row == nil {
		t.Fatalf("no rank-1 row in\n%s", out)
	}
	want := strings.Join(row[1:4], " ")
	got := strings.Join([]string{strconv.Itoa(doc.Parallelism.Shard), strconv.Itoa(doc.Parallelism.Rep), strconv.Itoa(doc.Parallelism.EP)}, " ")
	if got != want || doc.Training.Global != 512 || doc.Training.Seq != 4096 {
		t.Errorf("TOML degrees %s (global %d, seq %d), table's best %s", got, doc.Training.Global, doc.Training.Seq, want)
	}
	for _, n := range []string{"plan_lbs_tps", "plan_lbs_memory", "plan_scaling", "plan_breakdown"} {
		for _, ext := range []string{".png", ".svg"} {
			if fi, err := os.Stat(filepath.Join(plotDir, n+ext)); err != nil || fi.Size() == 0 {
				t.Errorf("plot %s%s: %v", n, ext, err)
			}
		}
	}
	// A second run refuses to overwrite, before searching; --force overwrites.
	if _, _, err := planRun(t, args...); !errors.Is(err, fileio.ErrExists) {
		t.Errorf("second run: err = %v, want ErrExists", err)
	}
	if _, _, err := planRun(t, "--model", "qwen3-30b-a3b", "--gpus", "64", "--seq", "4096", "--plot", plotDir); !errors.Is(err, fileio.ErrExists) {
		t.Errorf("second --plot run: err = %v, want ErrExists", err)
	}
	if _, _, err := planRun(t, append(args, "--force")...); err != nil {
		t.Errorf("--force: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); len(m) > 0 {
		t.Errorf("temporary files left: %v", m)
	}
}

func TestPlanCommandBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
		code int
	}{
		{[]string{"--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4096", "--memory-target", "0"}, []string{"--memory-target = 0", "(0, 1]"}, 2},
		{[]string{"--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4096", "--memory-target", "1.2"}, []string{"--memory-target = 1.2"}, 2},
		{[]string{"--model", "qwen3-30b-a3b", "--seq", "4096"}, []string{"--gpus = 0"}, 2},
		{[]string{"--gpus", "8", "--seq", "4096"}, []string{"--model is required"}, 2},
		// A global batch above 2^40 sequences once drew "must be ≥ 1 sequence", naming the wrong bound.
		{[]string{"--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4096", "--global-batch", "99999999999999"}, []string{"--global-batch = 99999999999999", "[1, 1099511627776]"}, 2},
		{[]string{"--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4096", "--gpu", "tpu9"}, []string{"--gpu"}, 2},
		{[]string{"--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4096", "--pp", "1,x"}, []string{`--pp = "1,x"`, `"x" must be an integer in [1, 1048576]`}, 2},
		{[]string{"--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4096", "--pp", "2", "--pp-microbatch-sizes", "0"}, []string{`--pp-microbatch-sizes = "0"`, "[1, 256]"}, 2},
		{[]string{"--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4096", "--pp", "2", "--pp-schedules", "1F1B,Foo"}, []string{`--pp-schedules = "1F1B,Foo"`, "pp_schedule = Foo"}, 2},
		{[]string{"--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4096", "--pp", "2", "--pp-schedules", "1F1B, 1F1B"}, []string{`--pp-schedules = "1F1B, 1F1B"`, "1F1B named twice"}, 2},
		// 30.5e9 parameters × 16 B = 488 GB of state on one GPU: nothing fits
		// at 0.92 of 178.35 GiB; the fake's FSDP state needs 16 × 30.5e9 /
		// (0.92 × 191.5e9 − activations) ≈ 2.8 GPUs → 4.
		{[]string{"--model", "qwen3-30b-a3b", "--gpus", "1", "--seq", "4096"}, []string{"no feasible plan on 1 GPU:", "closest", "at least 4 GPUs"}, 1},
		// 12 GPUs on hosts of 8 (hgx) is neither inside one host nor whole
		// hosts: refused before the search, 12 = 1 × 8 + 4, nearest 8 and 16;
		// on hosts of 5 (--gpus-per-node), 12 = 2 × 5 + 2, nearest 10 and 15.
		{[]string{"--model", "qwen3-30b-a3b", "--gpus", "12", "--seq", "4096"},
			[]string{"--gpus: gpus = 12 on hosts of gpus_per_node = 8", "12 = 1 × 8 + 4", "8 and 16 GPUs", "the cluster hgx's"}, 2},
		{[]string{"--model", "qwen3-30b-a3b", "--gpus", "12", "--gpus-per-node", "5", "--seq", "4096"},
			[]string{"12 = 2 × 5 + 2", "10 and 15 GPUs", "gpus_per_node: --gpus-per-node's"}, 2},
		// 100 sequences cannot be split over 64 data-parallel ranks.
		{[]string{"--model", "qwen3-30b-a3b", "--gpus", "64", "--seq", "4096", "--global-batch", "100"}, []string{"not a multiple", "128"}, 1},
	} {
		_, _, err := planRun(t, c.args...)
		if err == nil {
			t.Errorf("%v: no error", c.args)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q lacks %q", c.args, err, w)
			}
		}
		if exitCode(err) != c.code {
			t.Errorf("%v: exit code %d, want %d", c.args, exitCode(err), c.code)
		}
	}
}

// TestPlanCommandRealModelInfeasible runs the real evaluator (memory only:
// nothing fits, so nothing is simulated) on the tiny built-in model with a
// memory target no layout meets.
func TestPlanCommandRealModelInfeasible(t *testing.T) {
	var out, errb bytes.Buffer
	err := run(&out, &errb, []string{"plan", "--model", "tiny", "--gpus", "1", "--seq", "64", "--memory-target", "1e-9"})
	var inf *plan.InfeasibleError
	if !errors.As(err, &inf) || inf.Closest == nil || inf.Needed == "" {
		t.Fatalf("err = %v, want a PlanInfeasibleError with the closest point and what is needed", err)
	}
	if exitCode(err) == 0 {
		t.Error("exit code 0")
	}
	t.Log(err)
}

// TestPlanExportPrecision: an export that cannot write the run's storage
// types is refused before the search, naming the export's flag, the type's
// flag and its value, with a usage error and no file: torchtitan's
// training.mixed_precision_reduce takes only "float32" (job_config.py at
// v0.2.2, configs.py at b5bcd76c), and neither form stores bf16 gradients
// or AdamW moments beside fp32 parameters. sweep writes both forms.
func TestPlanExportPrecision(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"plan", "--reduce-dtype", "bf16", "--torchtitan-toml", filepath.Join(dir, "x.toml")},
			[]string{"--torchtitan-toml", "reduce_dtype = bf16 (--reduce-dtype)"}},
		{[]string{"plan", "--grad-dtype", "bf16", "--reduce-dtype", "f32", "--torchtitan-py", filepath.Join(dir, "x.py")},
			[]string{"--torchtitan-py", "grad_dtype = bf16 (--grad-dtype)"}},
		{[]string{"sweep", "--optimizer-dtype", "bf16", "--out", filepath.Join(dir, "sweep")},
			[]string{"optimizer_dtype = bf16 (--optimizer-dtype)"}},
	} {
		var out, errb bytes.Buffer
		err := run(&out, &errb, append(c.args, "--model", "tiny", "--gpus", "2", "--seq", "64"))
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: err = %v, want one naming %q", c.args, err, w)
			}
		}
		if !errors.Is(err, errUsage) {
			t.Errorf("%v: %v is not a usage error", c.args, err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("refused exports wrote %d files", len(ents))
	}
}

// TestPlanCommandTrace plans the tiny model with the real evaluator and
// writes the best plan's Chrome trace.
func TestPlanCommandTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.json")
	var out, errb bytes.Buffer
	if err := run(&out, &errb, []string{"plan", "--model", "tiny", "--gpus", "2", "--seq", "64", "--max-lbs", "4", "--trace", path}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var events []map[string]any
	if err := json.Unmarshal(b, &events); err != nil {
		var obj struct {
			TraceEvents []map[string]any `json:"traceEvents"`
		}
		if err2 := json.Unmarshal(b, &obj); err2 != nil {
			t.Fatalf("trace is not Chrome trace JSON: %v", err)
		}
		events = obj.TraceEvents
	}
	if len(events) == 0 {
		t.Error("trace has no events")
	}
}

func TestProgressBar(t *testing.T) {
	var buf bytes.Buffer
	if newProgressBar(&buf) != nil {
		t.Error("a progress bar on a buffer (not a terminal)")
	}
	var nilBar *progressBar
	nilBar.update(1, 1, 2) // no-ops on a nil bar
	nilBar.finish()
	b := &progressBar{w: &buf}
	b.update(2, 5, 10)
	b.update(2, 10, 10)
	b.finish()
	out := buf.String()
	// 30 cells, 5/10 done → 15 filled; then 10/10 → 30 filled.
	if !strings.Contains(out, "stage 2 ["+strings.Repeat("#", 15)+strings.Repeat(".", 15)+"] 5/10") ||
		!strings.Contains(out, "["+strings.Repeat("#", 30)+"] 10/10") || !strings.HasSuffix(out, "\r") {
		t.Errorf("bar output %q", out)
	}
}

func TestPlanCommandCalibration(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.json"), filepath.Join(dir, "bad.json")
	os.WriteFile(good, []byte(`{"gemm_scale": 0.9, "allocator_overhead": 0.08}`), 0o644)
	os.WriteFile(bad, []byte(`{"gemm_scael": 0.9}`), 0o644)
	if _, _, err := planRun(t, "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4096", "--calibration", good); err != nil {
		t.Errorf("good calibration: %v", err)
	}
	_, _, err := planRun(t, "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4096", "--calibration", bad)
	if err == nil || !strings.Contains(err.Error(), "gemm_scael") || exitCode(err) != 2 {
		t.Errorf("misspelt calibration field: err = %v", err)
	}
}

// TestPlanCalibrationOneReader: plan reads --calibration through the reader
// simulate uses (it had its own copy, which skipped validation, the 1 MiB
// bound and the trailing-data check): each bad file is refused by both, as a
// usage error naming the flag.
func TestPlanCalibrationOneReader(t *testing.T) {
	dir := t.TempDir()
	files := map[string][]byte{
		"trailing.json": []byte(`{"gemm_scale": 0.9} {}`),
		"range.json":    []byte(`{"gemm_scale": -1}`),
		"big.json":      append([]byte(`{"gemm_scale": 0.9}`), bytes.Repeat([]byte(" "), 1<<20)...),
	}
	for name, b := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := planRun(t, "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4096", "--calibration", p)
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "--calibration") {
			t.Errorf("plan with %s: err = %v, want a usage error naming --calibration", name, err)
		}
		var stdout, stderr bytes.Buffer
		err = run(&stdout, &stderr, []string{"simulate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4096", "--lbs", "1", "--calibration", p})
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "--calibration") {
			t.Errorf("simulate with %s: err = %v, want a usage error naming --calibration", name, err)
		}
	}
}

// TestPlanCommandExhaustive: the exhaustive mode reports one stage at the
// target and a best plan at least as fast as the hierarchical one.
func TestPlanCommandExhaustive(t *testing.T) {
	args := []string{"--model", "qwen3-30b-a3b", "--gpus", "32", "--seq", "4096", "--json"}
	h, _, err := planRun(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	e, _, err := planRun(t, append(args, "--exhaustive")...)
	if err != nil {
		t.Fatal(err)
	}
	var hr, er planReportJSON
	if err := json.Unmarshal([]byte(h), &hr); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(e), &er); err != nil {
		t.Fatal(err)
	}
	if !er.Exhaustive || len(er.Stages) != 1 || er.Stages[0].GPUs != 32 || hr.Exhaustive || len(hr.Stages) < 2 {
		t.Errorf("exhaustive %v with %d stages; hierarchical %v with %d", er.Exhaustive, len(er.Stages), hr.Exhaustive, len(hr.Stages))
	}
	if er.Best.TPS < hr.Best.TPS || hr.Best.TPS < 0.98*er.Best.TPS {
		t.Errorf("hierarchical best %.0f, exhaustive %.0f", hr.Best.TPS, er.Best.TPS)
	}
	t.Logf("hierarchical %.0f TPS (%d simulated), exhaustive %.0f TPS (%d simulated)", hr.Best.TPS, hr.Simulated, er.Best.TPS, er.Simulated)
}

// TestPlanCommandPipeline: with --pp the real evaluator searches
// pipelines of the tiny model; the stage table gains its best-pp column,
// and every pipeline plan in --json carries its pipeline fields.
func TestPlanCommandPipeline(t *testing.T) {
	text, rep := planTextAndJSON(t, "--model", "tiny", "--gpus", "16", "--seq", "64", "--max-lbs", "4", "--pp", "1,2", "--exhaustive", "--top", "1000")
	if !strings.Contains(text, "best pp") || !strings.Contains(text, "pipeline: PP ") {
		t.Errorf("stage table without the best-pp column, or no pipeline verdict:\n%s", text)
	}
	pipes := 0
	for _, p := range rep.Plans {
		if p.PP > 1 {
			pipes++
			if p.PPSchedule == "" || p.PPMicrobatchSize < 1 || p.PPVirtualStages < 1 || p.LBS%p.PPMicrobatchSize != 0 {
				t.Errorf("pipeline plan %+v: missing or inconsistent pipeline fields", p)
			}
		}
	}
	if pipes == 0 {
		t.Errorf("no pipeline among %d plans", len(rep.Plans))
	}
}

// TestPlanACFlag: --ac fixes the policy the search tries (here Megatron's
// recompute modules, which the default search leaves out), and a module
// that is not built is a usage error naming it and the built ones.
func TestPlanACFlag(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(&out, &errb, []string{"plan", "--model", "tiny", "--gpus", "2", "--seq", "64", "--max-lbs", "4",
		"--ac", "modules:moe_act,layernorm", "--json"}); err != nil {
		t.Fatal(err, errb.String())
	}
	var rep struct {
		Plans []struct {
			AC string `json:"ac"`
		} `json:"plans"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Plans) == 0 {
		t.Fatal("no plans")
	}
	for _, p := range rep.Plans {
		if p.AC != "modules:layernorm,moe_act" {
			t.Errorf("plan with ac %q", p.AC)
		}
	}
	err := run(&out, &errb, []string{"plan", "--model", "tiny", "--gpus", "2", "--seq", "64", "--ac", "modules:mlp"})
	if err == nil || !strings.Contains(err.Error(), "--ac") || !strings.Contains(err.Error(), `"mlp" is not built; built: layernorm, moe_act`) {
		t.Errorf("--ac modules:mlp: %v", err)
	}
}
