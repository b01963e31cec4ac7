package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/moescope/moescope/parallel/hw"
	"github.com/moescope/moescope/parallel/plan"
	"github.com/moescope/moescope/parallel/sim"
	"github.com/moescope/moescope/parallel/sim/cost"
	"github.com/moescope/moescope/parallel/titanlog"
)

// writeTitanLog writes a console log of one run as torchtitan v0.2.2
// prints it (components/metrics.py MetricsProcessor.log, tools/utils.py
// Color, tools/logging.py header, torchrun's [rank0]: prefix): a slow
// compiling first step, then steps at tps, memory peakGiB.
func writeTitanLog(path string, tps, peakGiB, capGiB float64, steps int, stated ...string) error {
	var b strings.Builder
	const red, green, orange, turq, blue, cyan, magenta, reset = "\033[31m", "\033[32m", "\033[38;2;180;60;0m", "\033[38;2;54;234;195m",
		"\033[34m", "\033[36m", "\033[35m", "\033[39m"
	fmt.Fprintf(&b, "[rank0]:[titan] 2026-03-02 14:00:00,000 - root - INFO - CUDA capacity: NVIDIA B200 with %.2fGiB memory\n", capGiB)
	for _, s := range stated {
		fmt.Fprintf(&b, "[rank0]:[titan] 2026-03-02 14:00:00,000 - root - INFO - %s\n", s)
	}
	for s := 1; s <= steps; s++ {
		t := tps
		if s == 1 {
			t = tps / 4
		}
		fmt.Fprintf(&b, "[rank0]:[titan] 2026-03-02 14:00:%02d,%03d - root - INFO - %sstep: %2d  %sloss: %8.5f  %sgrad_norm: %7.4f  "+
			"%smemory: %5.2fGiB(%.2f%%)  %stps: %s  %stflops: %.2f  %smfu: %.2f%%%s\n", s%60, s, red, s, green, 12-0.1*float64(s), orange, 1.5,
			turq, peakGiB, 100*peakGiB/capGiB, blue, commas(int64(math.Round(t))), cyan, t*0.02, magenta, t*0.02/22.5, reset)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// commas formats n as Python's {:,} does.
func commas(n int64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// TestSweepRecoversPlantedCalibration is the loop: the sweep for
// Qwen3-30B-A3B on 512 B200 picks its jobs; each is simulated with known
// multipliers planted; its log is written in torchtitan's format;
// calibrate reads the logs and TOMLs back. Every parameter the sweep
// reports identified must come back within 2% of the planted value; the
// others are listed as not identified.
func TestSweepRecoversPlantedCalibration(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates the sweep's search and fit (about a minute)")
	}
	dir, m := mainJobSweep(t)
	if len(m.Jobs) < 3 {
		t.Fatalf("%d jobs, want ≥ 3", len(m.Jobs))
	}
	cl, _ := hw.LoadCluster("hgx")
	// Multipliers are planted on the parameters the sweep identifies; the
	// others stay at their defaults: a planted error on a parameter the
	// runs cannot separate is absorbed by the identified ones (at one
	// sequence length the compute shares move together), which no fit
	// can undo, so such a plant would test nothing about the sweep.
	want := map[string]float64{cost.CalGEMM: 1, cost.CalGrouped: 1, cost.CalAttention: 1, cost.CalMemoryBound: 1,
		cost.CalNVLink: cl.NVLinkEfficiency, cost.CalNet: cl.NetEfficiency}
	plant := map[string]float64{cost.CalGEMM: 0.9, cost.CalGrouped: 0.85, cost.CalAttention: 1.1, cost.CalMemoryBound: 0.92,
		cost.CalNVLink: 0.9 * cl.NVLinkEfficiency, cost.CalNet: 0.8 * cl.NetEfficiency}
	for _, p := range m.Params {
		if p.Identified {
			want[p.Name] = plant[p.Name]
		}
	}
	planted := &cost.Calibration{GEMMScale: want[cost.CalGEMM], GroupedScale: want[cost.CalGrouped], AttentionScale: want[cost.CalAttention],
		MemoryBoundScale: want[cost.CalMemoryBound], NVLinkEfficiency: want[cost.CalNVLink], NetEfficiency: want[cost.CalNet]}
	dev, _ := hw.LookupDevice("b200")
	args := []string{"calibrate", "--gpu", "b200", "--runs-out", filepath.Join(dir, "runs.json"), "--out", filepath.Join(dir, "cal.json")}
	twoHost := false
	for _, j := range m.Jobs {
		twoHost = twoHost || j.Plan.GPUs == 16
		logPath := filepath.Join(dir, j.Name+".log")
		writeSimulatedLog(t, j.TOML, logPath, dev, planted)
		args = append(args, "--torchtitan-log", logPath, "--job-config", j.TOML)
	}
	if !twoHost {
		t.Errorf("no 2-host (16 GPU) job in the sweep")
	}
	var out bytes.Buffer
	if err := run(&out, &out, args); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	cal, err := cost.ReadCalibration(filepath.Join(dir, "cal.json"))
	if err != nil {
		t.Fatal(err)
	}
	// Both commands use the one run-to-run noise, 2%: the sweep plans at
	// it (assumed_tps_noise) and calibrate, whose simulated, noise-free
	// logs leave residuals far below it, reports it as the residual spread
	// (never below the noise).
	if m.Noise != 0.02 || cal.ResidualSD != m.Noise {
		t.Errorf("sweep assumed_tps_noise %v, calibrate residual_sd %v: want both 0.02", m.Noise, cal.ResidualSD)
	}
	got := map[string]float64{cost.CalGEMM: cal.GEMMScale, cost.CalGrouped: cal.GroupedScale, cost.CalAttention: cal.AttentionScale,
		cost.CalMemoryBound: cal.MemoryBoundScale, cost.CalNVLink: cal.NVLinkEfficiency, cost.CalNet: cal.NetEfficiency}
	for n, v := range got {
		if v == 0 { // kept at its default
			got[n] = map[string]float64{cost.CalNVLink: cl.NVLinkEfficiency, cost.CalNet: cl.NetEfficiency}[n]
			if got[n] == 0 {
				got[n] = 1
			}
		}
	}
	identified := 0
	for _, p := range m.Params {
		e := got[p.Name]/want[p.Name] - 1
		t.Logf("%s: planted %.4g, calibrated %.4g (%+.2f%%), sweep posterior std %.2f%%, identified %v", p.Name, want[p.Name], got[p.Name], 100*e, 100*p.Std, p.Identified)
		if p.Identified {
			identified++
			if math.Abs(e) > 0.02 {
				t.Errorf("%s: identified by the sweep, but calibrated %.4g vs planted %.4g (%+.2f%%, beyond 2%%)", p.Name, got[p.Name], want[p.Name], 100*e)
			}
		}
	}
	if identified == 0 {
		t.Errorf("the sweep identifies no parameter: the test would be empty")
	}
	if !strings.Contains(out.String(), "calibration of ") {
		t.Errorf("calibrate output:\n%s", out.String())
	}
}

// writeSimulatedLog writes, to logPath, the console log torchtitan v0.2.2
// would print for the job config jobPath if the GPUs ran as the simulator
// does with calibration planted: the start-up lines calibrate checks
// (parallel_dims.py 130–134, train.py 354–362 at 73a0e69), then ten steps
// at the simulated TPS and peak reserved memory (writeTitanLog). Given
// filled, the values for the config's placeholders, the log first prints
// the config (job.print_config: `Running with configs:` and the TOML's
// sections as JSON, each placeholder replaced by filled[key]).
func writeSimulatedLog(t *testing.T, jobPath, logPath string, dev hw.Device, planted *cost.Calibration, filled ...map[string]string) {
	t.Helper()
	var doc map[string]any
	if _, err := toml.DecodeFile(jobPath, &doc); err != nil {
		t.Fatalf("%s does not parse: %v", jobPath, err)
	}
	var stated []string
	if len(filled) > 0 {
		for sec, body := range doc {
			for k, v := range body.(map[string]any) {
				if s, ok := v.(string); ok && strings.HasPrefix(s, plan.Placeholder) {
					if filled[0][k] == "" {
						t.Fatalf("%s: no value to fill [%s] %s with", jobPath, sec, k)
					}
					body.(map[string]any)[k] = filled[0][k]
				}
			}
		}
		js, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		stated = append(stated, "Running with configs: "+strings.ReplaceAll(string(js), "\n", "\n[rank0]:"))
	}
	job, err := titanlog.ReadJobConfig(jobPath)
	if err != nil {
		t.Fatal(err)
	}
	in, _, err := titanlog.Input{Log: &titanlog.Log{}, Job: job, Device: dev}.RunLayout()
	if err != nil {
		t.Fatal(err)
	}
	in.Calibration = planted
	res, err := sim.Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	mesh := fmt.Sprintf("Building device mesh with parallelism: pp=1, dp_replicate=%d, dp_shard=%d, cp=1, tp=%d, ep=%d, etp=%d",
		job.DPReplicate, job.DPShard, job.TP, job.EP, job.ETP)
	gbs := job.GlobalBatch
	if gbs == 0 {
		gbs = job.LBS * job.DPShard * job.DPReplicate
	}
	trainer := fmt.Sprintf("Trainer is initialized with local batch size %d, global batch size %d, gradient accumulation steps %d, sequence length %d, total steps 10 (warmup 2)",
		job.LBS, gbs, gbs/(job.LBS*job.DPShard*job.DPReplicate), job.Seq)
	if err := writeTitanLog(logPath, res.TPS, float64(res.PeakReservedBytes)/hw.GiB, dev.MemoryGiB(), 10, append(stated, mesh, trainer)...); err != nil {
		t.Fatal(err)
	}
}

// TestSweepWritesRunnableJobs: the sweep names every file it writes
// (`wrote` on stderr, one line per file, nothing unnamed); each job config
// parses in both forms, every TOML key is in the pinned v0.2.2 schema
// excerpt, and the tokenizer folder and dataset are placeholders; each run
// script states its working directory, turns print_config on, refuses
// unfilled placeholders and tees each one-host job's log to the folder
// where the manifest's calibrate command reads it, and bash parses it.
func TestSweepWritesRunnableJobs(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if err := run(&out, &errb, []string{"sweep", "--model", "qwen3-30b-a3b", "--gpu", "b200", "--gpus", "512", "--seq", "4096", "--out", dir}); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	entries, _ := os.ReadDir(dir)
	wrote := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(errb.String()), "\n") {
		wrote[strings.TrimPrefix(l, "wrote ")] = strings.HasPrefix(l, "wrote ")
	}
	for _, e := range entries {
		if p := filepath.Join(dir, e.Name()); !wrote[p] {
			t.Errorf("%s written without a `wrote` line; stderr:\n%s", p, errb.String())
		}
	}
	if len(wrote) != len(entries) {
		t.Errorf("%d lines on stderr for %d files:\n%s", len(wrote), len(entries), errb.String())
	}
	var schema struct {
		Sections map[string]map[string]any `json:"sections"`
	}
	b, err := os.ReadFile("../../testdata/torchtitan/v0.2.2-job_config.json")
	if err != nil || json.Unmarshal(b, &schema) != nil {
		t.Fatalf("schema excerpt: %v", err)
	}
	var m sweepManifest
	if b, err = os.ReadFile(filepath.Join(dir, "manifest.json")); err != nil || json.Unmarshal(b, &m) != nil {
		t.Fatalf("manifest: %v", err)
	}
	for _, j := range m.Jobs {
		var doc map[string]map[string]any
		if _, err := toml.DecodeFile(j.TOML, &doc); err != nil {
			t.Fatalf("%s: %v", j.TOML, err)
		}
		for sec, keys := range doc {
			for k := range keys {
				if _, ok := schema.Sections[sec][k]; !ok {
					t.Errorf("%s: [%s] %s is not in torchtitan v0.2.2's schema excerpt", j.TOML, sec, k)
				}
			}
		}
		for _, k := range [][2]string{{"model", "hf_assets_path"}, {"training", "dataset"}} {
			if v, _ := doc[k[0]][k[1]].(string); !strings.HasPrefix(v, plan.Placeholder) {
				t.Errorf("%s: [%s] %s = %q, want a placeholder", j.TOML, k[0], k[1], v)
			}
		}
		for _, f := range []string{j.TOML, j.Python} {
			if _, err := titanlog.ReadJobConfig(f); err != nil {
				t.Errorf("%v", err)
			}
		}
		if !strings.Contains(m.Calibrate, filepath.Join(dir, j.Name+".log")) {
			t.Errorf("calibrate command does not read %s.log from %s: %s", j.Name, dir, m.Calibrate)
		}
	}
	for k, s := range m.Scripts {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, want := range []string{"# Working directory: the root of that torchtitan checkout", `grep -l "<FILL: "`,
			[]string{"--job.print_config", "--debug.print_config"}[k]} {
			if !strings.Contains(text, want) {
				t.Errorf("%s lacks %q", s, want)
			}
		}
		for _, j := range m.Jobs {
			if !strings.Contains(text, fmt.Sprintf(`tee "$sweep/%s.log"`, j.Name)) {
				t.Errorf("%s does not tee %s's log into the sweep's folder", s, j.Name)
			}
		}
		if sh, err := exec.LookPath("bash"); err == nil {
			if out, err := exec.Command(sh, "-n", s).CombinedOutput(); err != nil {
				t.Errorf("bash -n %s: %v\n%s", s, err, out)
			}
		}
	}
}

// mainJobSweep runs the sweep of the README's main job (Qwen3-30B-A3B for
// 512 B200s at seq 4096) into a temporary folder and returns the folder
// and its manifest.
func mainJobSweep(t *testing.T) (string, sweepManifest) {
	t.Helper()
	dir := t.TempDir()
	var out bytes.Buffer
	if err := run(&out, &out, []string{"sweep", "--model", "qwen3-30b-a3b", "--gpu", "b200", "--gpus", "512", "--seq", "4096", "--out", dir}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	var m sweepManifest
	data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil || json.Unmarshal(data, &m) != nil {
		t.Fatalf("manifest: %v", err)
	}
	return dir, m
}
