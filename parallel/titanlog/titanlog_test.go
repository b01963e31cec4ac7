package titanlog

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/parallel/hw"
)

// The fixtures in testdata were written for these tests to the format of
// torchtitan's components/metrics.py and tools/logging.py (see doc.go);
// none is copied from a run. Rank 0's steps 1–10 log tps 9,512 (the
// compiling first step), then 30,950 31,210 31,044 30,873 31,102 31,188
// 30,991 31,057 31,120: sorted, the nine steady values have 31,057 in the
// middle, the expected median below; memory 137.77 GiB at step 1, 141.27
// GiB after.

func load(t *testing.T, name string) *Log {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	lg, err := Parse(name, data)
	if err != nil {
		t.Fatal(err)
	}
	return lg
}

func b200(t *testing.T) hw.Device {
	t.Helper()
	d, err := hw.LookupDevice("b200")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestSteadyMedian(t *testing.T) {
	for _, name := range []string{"rank0_colour.log", "interleaved.log", "main_na.log", "printed_config.log"} {
		lg := load(t, name)
		st, err := lg.Steady(1)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if st.TPS != 31057 || st.PeakReservedGiB != 141.27 || st.First != 2 || st.Last != 10 || st.Kept != 9 {
			t.Errorf("%s: steady = %+v, want tps 31057, peak 141.27 GiB, steps 2–10 (9 kept)", name, st)
		}
		if lg.CapacityGiB != 178.35 {
			t.Errorf("%s: capacity %v GiB, want 178.35", name, lg.CapacityGiB)
		}
		if (st.MFU == nil) != (name == "main_na.log") {
			t.Errorf("%s: mfu = %v: want nil only where the log prints N/A", name, st.MFU)
		}
	}
	// With nothing dropped, the compiling step 1 (9,512) joins: ten values,
	// median (31,044 + 31,057)/2.
	if st, _ := load(t, "rank0_colour.log").Steady(0); st.TPS != 31050.5 {
		t.Errorf("skip 0: tps %v, want 31050.5", st.TPS)
	}
}

func TestInterleavedReadsRankZero(t *testing.T) {
	lg := load(t, "interleaved.log")
	if len(lg.Steps) != 10 || len(lg.Notes) != 1 || !strings.Contains(lg.Notes[0], "other ranks") {
		t.Errorf("steps %d, notes %q: want rank 0's 10 steps and a note on the skipped lines", len(lg.Steps), lg.Notes)
	}
}

func TestTruncatedSkipsLastLine(t *testing.T) {
	lg := load(t, "truncated.log")
	st, err := lg.Steady(1)
	// Steps 2–6 survive the cut inside step 7: 30,950 31,210 31,044 30,873
	// 31,102, median 31,044.
	if err != nil || st.TPS != 31044 || st.Last != 6 {
		t.Fatalf("steady = %+v, %v; want median 31044 up to step 6", st, err)
	}
	if len(lg.Notes) != 1 || !strings.Contains(lg.Notes[0], "cut short") {
		t.Errorf("notes %q: want one saying the last line was cut short", lg.Notes)
	}
}

func TestLogErrors(t *testing.T) {
	if _, err := load(t, "no_steady.log").Steady(1); err == nil || !strings.Contains(err.Error(), "no steady steps") {
		t.Errorf("no_steady.log: err = %v, want no steady steps", err)
	}
	data, _ := os.ReadFile("testdata/config_cut.log")
	if _, err := Parse("config_cut.log", data); err == nil || !strings.Contains(err.Error(), "never ends") {
		t.Errorf("config_cut.log: err = %v, want the printed config cut short", err)
	}
	bad := map[string]string{
		"step:  3  loss: 10.9  grad_norm: 3.5  memory: 12GiB  tps: 5\nstep: 4  loss: 1.0  grad_norm:  1.0  memory:  1.00GiB(1.00%)  tps: 1  tflops: 1.00  mfu: 1.00%\n": "line 1",
		"[rank1]:step:  3  loss: 1.0\n": "no [rank0]: lines",
		"step:  3  loss:  1.00000  grad_norm:  1.0000  memory:  1.00GiB(1.00%)  tps: 1  tflops: 1.00  mfu: 1.00%\n" +
			"step:  3  loss:  1.00000  grad_norm:  1.0000  memory:  1.00GiB(1.00%)  tps: 1  tflops: 1.00  mfu: 1.00%\n": "already logged",
		"": "",
	}
	for in, want := range bad {
		lg, err := Parse("x.log", []byte(in))
		if want == "" {
			if _, err = lg.Steady(1); err == nil || !strings.Contains(err.Error(), "no step lines") {
				t.Errorf("empty log: %v, want no step lines", err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want %q", in, err, want)
		}
	}
}

func TestJobConfigForms(t *testing.T) {
	toml, err := ReadJobConfig("testdata/rank0_colour.toml")
	if err != nil {
		t.Fatal(err)
	}
	py, err := ReadJobConfig("testdata/main_na.py")
	if err != nil {
		t.Fatal(err)
	}
	printed, err := FromPrinted("printed", load(t, "printed_config.log").Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range []*Job{toml, py, printed} {
		if err := agree("l.log", toml, j); err != nil {
			t.Errorf("%s: %v", j.Where, err)
		}
	}
	r, err := toml.run("b200")
	if err != nil {
		t.Fatal(err)
	}
	// By hand from the TOML: 8 GPUs = shard 8 × replicate 1; global batch
	// 32 = lbs 4 × 8 → one micro-step.
	if r.Model != "qwen3-30b-a3b" || r.GPUs != 8 || r.DPShard != 8 || r.EP != 1 || r.LBS != 4 || r.Seq != 4096 || r.AC.String() != "selective" ||
		r.GradAccum != 1 || !r.Compile || len(r.CompileComponents) != 0 || !r.ReshardAfterForward {
		t.Errorf("run = %+v", r)
	}
}

func TestRunChecks(t *testing.T) {
	dev := b200(t)
	job, err := ReadJobConfig("testdata/rank0_colour.toml")
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = Input{Log: load(t, "disagrees.log"), Job: job, Device: dev, Skip: 1}.Run()
	if err == nil || !strings.Contains(err.Error(), "local batch (sequences): 4 in testdata/rank0_colour.toml, 2 in") {
		t.Errorf("disagrees.log: err = %v, want the local batches named", err)
	}
	h100, _ := hw.LookupDevice("h100")
	if _, _, err = (Input{Log: load(t, "rank0_colour.log"), Job: job, Device: h100, Skip: 1}).Run(); err == nil || !strings.Contains(err.Error(), "178.35 GiB") {
		t.Errorf("wrong device: err = %v", err)
	}
	if _, _, err = (Input{Log: load(t, "rank0_colour.log"), Device: dev, Skip: 1}).Run(); err == nil || !strings.Contains(err.Error(), "no job config") {
		t.Errorf("no config: err = %v", err)
	}
	r, _, err := Input{Log: load(t, "printed_config.log"), Device: dev, Skip: 1}.Run()
	if err != nil {
		t.Fatal(err)
	}
	if r.TPS != 31057 || *r.PeakReservedBytes != 151687507476 {
		// 141.27 × 2^30 = 141 × 1,073,741,824 + 0.27 × 1,073,741,824
		// = 151,397,597,184 + 289,910,292.48 bytes, rounded.
		t.Errorf("run tps %v, peak %d", r.TPS, *r.PeakReservedBytes)
	}
}

func TestJobConfigErrors(t *testing.T) {
	cases := map[string]string{
		"[model]\nname = \"qwen3\"\nflavor = \"30B-A3B\"\n[parallelism]\ncontext_parallel_degree = 2\n":        "context_parallel_degree = 2",
		"[model]\nname = \"qwen3\"\nflavor = \"30B-A3B\"\n[activation_checkpoint]\nmode = \"memory_budget\"\n": "memory_budget",
		"[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n":                                                "no moescope model",
		"[model]\nname = \"qwen3\"\nflavor = \"30B-A3B\"\nconverters = [\"quantize.grouped_mm.float16\"]\n":    "model.converters",
		"[training\n": "not TOML",
	}
	for in, want := range cases {
		if _, err := ParseTOML("x.toml", []byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want %q", in, err, want)
		}
	}
	// v0.2.2's default dp_shard of -1 leaves the GPU count unknown.
	j, err := ParseTOML("x.toml", []byte("[model]\nname = \"qwen3\"\nflavor = \"30B-A3B\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.run("b200"); err == nil || !strings.Contains(err.Error(), "data_parallel_shard_degree = -1") {
		t.Errorf("dp_shard -1: err = %v", err)
	}
	if _, err := ParseRegistry("x.py", []byte("config = qwen3_30b_a3b()\nconfig.training.max_context_length = 4096\n")); err == nil ||
		!strings.Contains(err.Error(), "num_tokens_per_microbatch_per_dp_rank") || !strings.Contains(err.Error(), "activation_checkpoint") {
		t.Errorf("registry with fields missing: err = %v", err)
	}
}

// FuzzParse: no input makes the parser panic or hang.
func FuzzParse(f *testing.F) {
	for _, n := range []string{"rank0_colour.log", "interleaved.log", "truncated.log", "config_cut.log"} {
		data, _ := os.ReadFile(filepath.Join("testdata", n))
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if lg, err := Parse("f", data); err == nil {
			lg.Steady(1)
		}
	})
}

// TestJobConfigTP: v0.2.2's tensor_parallel_degree,
// expert_tensor_parallel_degree and enable_async_tensor_parallel (its
// job_config.py Parallelism at 73a0e69) become the run's tp, etp and
// async_tp, the world dp_replicate × dp_shard × tp.
func TestJobConfigTP(t *testing.T) {
	j, err := ParseTOML("x.toml", []byte("[model]\nname = \"qwen3\"\nflavor = \"30B-A3B\"\n[training]\nlocal_batch_size = 2\nseq_len = 4096\n"+
		"[parallelism]\ndata_parallel_shard_degree = 4\ntensor_parallel_degree = 2\nexpert_parallel_degree = 4\nexpert_tensor_parallel_degree = 2\nenable_async_tensor_parallel = true\n"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := j.run("b200")
	if err != nil {
		t.Fatal(err)
	}
	if r.GPUs != 8 || r.TP != 2 || r.ETP != 2 || !r.AsyncTP || r.DPShard != 4 {
		t.Errorf("run %+v: want gpus 8 = dp_shard 4 × tp 2, etp 2, async", r)
	}
	l := r.Layout
	err = l.Resolve()
	// efsdp = dp_shard·tp/(ep·etp) = 4·2/(4·2) = 1.
	if err != nil || l.ExpertShard() != 1 {
		t.Errorf("layout %+v, %v: efsdp %d, want 1", l, err, l.ExpertShard())
	}
}

// TestFilesRuns: a log with its TOML and two logs that printed their
// configs read as runs in order (tps 31,057, the median above); a log or a
// job config that cannot be read names its flag.
func TestFilesRuns(t *testing.T) {
	dev := b200(t)
	runs, _, err := Files{Logs: []string{"testdata/rank0_colour.log"}, Jobs: []string{"testdata/rank0_colour.toml"}, Device: dev, Skip: 1}.Runs()
	if err != nil || len(runs) != 1 || runs[0].TPS != 31057 || runs[0].GPUs != 8 {
		t.Fatalf("rank0_colour.log: %+v, %v", runs, err)
	}
	runs, _, err = Files{Logs: []string{"testdata/printed_config.log", "testdata/printed_config.log"}, Device: dev, Skip: 1}.Runs()
	if err != nil || len(runs) != 2 || runs[1].TPS != 31057 {
		t.Fatalf("two printed configs: %+v, %v", runs, err)
	}
	for _, c := range []struct {
		f    Files
		want string
	}{
		{Files{Logs: []string{"testdata/missing.log"}, Device: dev}, "--torchtitan-log: "},
		{Files{Logs: []string{"testdata/rank0_colour.log"}, Jobs: []string{"testdata/missing.toml"}, Device: dev}, "--job-config: "},
	} {
		if _, _, err := c.f.Runs(); err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %s", c.f, err, c.want)
		}
	}
}
