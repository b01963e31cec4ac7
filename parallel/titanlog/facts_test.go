package titanlog

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
)

// stated_b4.log and stated_b2.log are rank0_colour.log with the start-up
// lines torchtitan v0.2.2 prints (train.py 354–362 and 174–177,
// parallel_dims.py 130–134 at 73a0e69) inserted as lines 3–5: the mesh
// pp=1 dp_replicate=1 dp_shard=8 cp=1 tp=1 ep=1 etp=1 (line 3), the model
// qwen3 30B-A3B (line 4), and local batch 4, global 32 (b4) or local 2,
// global 16 (b2), one accumulation step, sequence length 4096 (line 5).
// rank0_colour.toml is b4's job config, stated_b2.toml b2's.

func TestFactsParsed(t *testing.T) {
	f := load(t, "stated_b2.log").Facts
	want := Facts{TrainerLine: 5, LBS: 2, GlobalBatch: 16, Seq: 4096, Accum: 1,
		MeshLine: 3, PP: 1, DPReplicate: 1, DPShard: 8, CP: 1, TP: 1, EP: 1, ETP: 1,
		ModelLine: 4, ModelName: "qwen3", Flavor: "30B-A3B"}
	if f != want {
		t.Errorf("facts %+v\nwant  %+v", f, want)
	}
	if f := load(t, "rank0_colour.log").Facts; f != (Facts{}) {
		t.Errorf("rank0_colour.log states nothing, read %+v", f)
	}
}

// TestFactsMatch: each log with its own config reads as the run
// rank0_colour.log gives (tps 31,057, 8 GPUs), the batch its config's.
func TestFactsMatch(t *testing.T) {
	dev := b200(t)
	for _, c := range []struct {
		log, cfg string
		lbs      int
	}{{"stated_b4.log", "rank0_colour.toml", 4}, {"stated_b2.log", "stated_b2.toml", 2}} {
		job, err := ReadJobConfig("testdata/" + c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		r, _, err := Input{Log: load(t, c.log), Job: job, Device: dev, Skip: 1}.Run()
		if err != nil {
			t.Fatalf("%s with %s: %v", c.log, c.cfg, err)
		}
		if r.TPS != 31057 || r.GPUs != 8 || r.LBS != c.lbs || r.GradAccum != 1 {
			t.Errorf("%s: run %+v", c.log, r)
		}
	}
}

// TestFactsSwapped: each log given the other's config is refused, the
// error naming the log, the config, the field and both values.
func TestFactsSwapped(t *testing.T) {
	dev := b200(t)
	for _, c := range []struct {
		log, cfg string
		want     []string
	}{
		{"stated_b4.log", "stated_b2.toml", []string{
			"local batch size: 4 in stated_b4.log (line 5), 2 in testdata/stated_b2.toml",
			"global batch size: 32 in stated_b4.log (line 5), 16 in testdata/stated_b2.toml"}},
		{"stated_b2.log", "rank0_colour.toml", []string{
			"local batch size: 2 in stated_b2.log (line 5), 4 in testdata/rank0_colour.toml",
			"global batch size: 16 in stated_b2.log (line 5), 32 in testdata/rank0_colour.toml"}},
	} {
		job, err := ReadJobConfig("testdata/" + c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = Input{Log: load(t, c.log), Job: job, Device: dev, Skip: 1}.Run()
		if !errors.Is(err, ErrMismatch) {
			t.Fatalf("%s with %s: err = %v, want ErrMismatch", c.log, c.cfg, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s with %s: err = %v\nwant %q", c.log, c.cfg, err, w)
			}
		}
		// Both hold 8 GPUs, seq 4096 and one accumulation step: only the
		// batches differ.
		if strings.Contains(err.Error(), "sequence length") || strings.Contains(err.Error(), "accumulation") || strings.Contains(err.Error(), "degree") {
			t.Errorf("%s with %s: fields that agree reported: %v", c.log, c.cfg, err)
		}
	}
}

// withLine is testdata/name with line inserted after its second line,
// behind torchrun's [rank0]: prefix where the file's lines have it.
func withLine(t *testing.T, name, line string) *Log {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfterN(string(data), "\n", 3)
	if strings.HasPrefix(lines[0], "[rank0]:") {
		line = "[rank0]:" + line
	}
	lg, err := Parse(name, []byte(lines[0]+lines[1]+line+"\n"+lines[2]))
	if err != nil {
		t.Fatal(err)
	}
	return lg
}

func TestFactsFields(t *testing.T) {
	dev := b200(t)
	toml, err := ReadJobConfig("testdata/rank0_colour.toml")
	if err != nil {
		t.Fatal(err)
	}
	py, err := ReadJobConfig("testdata/main_na.py")
	if err != nil {
		t.Fatal(err)
	}
	const hdr = "[titan] 2026-03-02 14:00:01,500 - root - INFO - "
	mainLine := func(perRank, perStep int) string {
		return hdr + "Trainer is initialized with " + strconv.Itoa(perRank) + " tokens per DP rank, " + strconv.Itoa(perStep) +
			" tokens per train step, gradient accumulation steps 1, maximum context length 4096, total steps 10 (warmup 2)"
	}
	for _, c := range []struct {
		log, line string
		job       *Job
		want      []string // nil: no error
	}{
		// main (trainer.py 621–629 at b5bcd76): main_na.py's 16,384 tokens
		// per DP rank (lbs 4 × 4096) and 131,072 per step (32 × 4096).
		{"main_na.log", mainLine(16384, 131072), py, nil},
		{"main_na.log", mainLine(32768, 262144), py, []string{
			"tokens per DP rank (num_tokens_per_microbatch_per_dp_rank): 32768 in main_na.log (line 3), 16384 in testdata/main_na.py",
			"tokens per train step (num_tokens_per_train_step): 262144 in main_na.log (line 3), 131072 in testdata/main_na.py"}},
		// main's mesh line has no etp.
		{"main_na.log", hdr + "Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=8, cp=1, tp=1, ep=1", py, nil},
		// 4 GPUs where the config has 8: the shard degree and the world.
		{"rank0_colour.log", hdr + "Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=4, cp=1, tp=1, ep=1, etp=1", toml, []string{
			"GPU count (the product of the mesh degrees): 4 in rank0_colour.log (line 3), 8 in testdata/rank0_colour.toml",
			"data_parallel_shard_degree: 4 in rank0_colour.log (line 3), 8 in testdata/rank0_colour.toml"}},
		{"rank0_colour.log", hdr + "Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=8, cp=1, tp=1, ep=8, etp=1", toml, []string{
			"expert_parallel_degree: 8 in rank0_colour.log (line 3), 1 in testdata/rank0_colour.toml"}},
		{"rank0_colour.log", hdr + "Trainer is initialized with local batch size 4, global batch size 64, gradient accumulation steps 2, sequence length 8192, total steps 10 (warmup 2)", toml, []string{
			"global batch size: 64 in rank0_colour.log (line 3), 32 in testdata/rank0_colour.toml",
			"gradient accumulation steps: 2 in rank0_colour.log (line 3), 1 in testdata/rank0_colour.toml",
			"sequence length: 8192 in rank0_colour.log (line 3), 4096 in testdata/rank0_colour.toml"}},
		{"rank0_colour.log", hdr + "Model qwen3 235B-A22B size: 235,093,634,560 total parameters", toml, []string{
			"model: qwen3 235B-A22B (qwen3-235b-a22b) in rank0_colour.log (line 3), qwen3-30b-a3b in testdata/rank0_colour.toml"}},
		{"rank0_colour.log", hdr + "Model llama3 debugmodel size: 6,139,648 total parameters", toml, []string{
			"model: llama3 debugmodel (no moescope model) in rank0_colour.log (line 3)"}},
	} {
		_, _, err := Input{Log: withLine(t, c.log, c.line), Job: c.job, Device: dev, Skip: 1}.Run()
		if c.want == nil {
			if err != nil {
				t.Errorf("%s + %q: %v", c.log, c.line, err)
			}
			continue
		}
		if !errors.Is(err, ErrMismatch) {
			t.Errorf("%s + %q: err = %v, want ErrMismatch", c.log, c.line, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s + %q: err = %v\nwant %q", c.log, c.line, err, w)
			}
		}
	}
}

// TestFactsResolveShard: a v0.2.2 config's data_parallel_shard_degree of
// -1 (the rest of the world) takes the degree the mesh line states after
// torchtitan resolved it: 8 GPUs; without the line it is refused.
func TestFactsResolveShard(t *testing.T) {
	job, err := ParseTOML("x.toml", []byte("[model]\nname = \"qwen3\"\nflavor = \"30B-A3B\"\n[training]\nlocal_batch_size = 4\nseq_len = 4096\n"))
	if err != nil {
		t.Fatal(err)
	}
	lg := withLine(t, "rank0_colour.log", "[titan] 2026-03-02 14:00:01,500 - root - INFO - Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=8, cp=1, tp=1, ep=1, etp=1")
	r, _, err := Input{Log: lg, Job: job, Device: b200(t), Skip: 1}.Run()
	if err != nil || r.GPUs != 8 || r.DPShard != 8 || r.GradAccum != 1 {
		t.Errorf("run %+v, %v: want 8 GPUs, dp_shard 8", r, err)
	}
	if job.DPShard != -1 {
		t.Errorf("the job config was changed: dp_shard %d", job.DPShard)
	}
	if _, _, err := (Input{Log: load(t, "rank0_colour.log"), Job: job, Device: b200(t), Skip: 1}).Run(); err == nil || !strings.Contains(err.Error(), "= -1") {
		t.Errorf("no mesh line: err = %v", err)
	}
	// stated_b4.log states the mesh (dp_shard 8) and global batch 32 =
	// lbs 4 × 8: the resolved degree agrees; stated_b2.log's local batch
	// 2 does not, and the message says where the degree came from.
	if r, _, err := (Input{Log: load(t, "stated_b4.log"), Job: job, Device: b200(t), Skip: 1}).Run(); err != nil || r.GPUs != 8 {
		t.Errorf("stated_b4.log: %+v, %v", r, err)
	}
	_, _, err = Input{Log: load(t, "stated_b2.log"), Job: job, Device: b200(t), Skip: 1}.Run()
	if want := "local batch size: 2 in stated_b2.log (line 5), 4 in x.toml (data_parallel_shard_degree -1, 8 as stated_b2.log line 3 states)"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("stated_b2.log: err = %v\nwant %q", err, want)
	}
	// A trainer line but no mesh line: the default global batch is not
	// known (lbs × an unknown degree), so only the local batch and the
	// sequence length are compared, and they agree; the -1 is then
	// refused as before.
	lg = withLine(t, "rank0_colour.log", "[titan] 2026-03-02 14:00:01,500 - root - INFO - Trainer is initialized with local batch size 4, global batch size 32, "+
		"gradient accumulation steps 1, sequence length 4096, total steps 10 (warmup 2)")
	if _, _, err := (Input{Log: lg, Job: job, Device: b200(t), Skip: 1}).Run(); err == nil || errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "= -1") {
		t.Errorf("trainer line, no mesh line: err = %v", err)
	}
}

func TestFactsTwice(t *testing.T) {
	data, _ := os.ReadFile("testdata/stated_b4.log")
	line := strings.SplitAfter(string(data), "\n")[4]
	if _, err := Parse("x.log", append(data, line...)); err == nil || !strings.Contains(err.Error(), "a second `Trainer is initialized with …` line (the first at line 5)") {
		t.Errorf("err = %v", err)
	}
}

// TestPrintedMainChecked: a log that printed main's config (to_dict's
// form, torchtitan/trainer.py 224–226 at b5bcd76), read with its registry
// function, is checked against it on the fields that form keeps: the same
// layout as main_na.py agrees; data_parallel_shard_degree 4 does not.
// Alone it is refused: it does not name the checkpointing policy.
func TestPrintedMainChecked(t *testing.T) {
	py, err := ReadJobConfig("testdata/main_na.py")
	if err != nil {
		t.Fatal(err)
	}
	printed := func(shard int) string {
		return `[titan] 2026-03-02 14:00:01,500 - root - INFO - Running with configs: {"model_spec": {"name": "qwen3", "flavor": "30B-A3B"}, ` +
			`"training": {"num_tokens_per_microbatch_per_dp_rank": 16384, "num_tokens_per_train_step": 131072, "max_context_length": 4096}, ` +
			`"parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": ` + strconv.Itoa(shard) + `, "fsdp_reshard_after_forward": "default", ` +
			`"tensor_parallel_degree": 1, "context_parallel_degree": 1, "pipeline_parallel_degree": 1, "expert_parallel_degree": 1}, ` +
			`"compile": {"enable": true, "components": ["model", "loss"]}, "activation_checkpoint": {"mode": "selective"}}`
	}
	dev := b200(t)
	if _, _, err := (Input{Log: withLine(t, "main_na.log", printed(8)), Job: py, Device: dev, Skip: 1}).Run(); err != nil {
		t.Errorf("agreeing: %v", err)
	}
	_, _, err = Input{Log: withLine(t, "main_na.log", printed(4)), Job: py, Device: dev, Skip: 1}.Run()
	if want := "data_parallel_shard_degree: 8 in testdata/main_na.py, 4 in main_na.log: the config printed at line 3"; !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), want) {
		t.Errorf("dp_shard 4: err = %v\nwant %q", err, want)
	}
	if _, _, err := (Input{Log: withLine(t, "main_na.log", printed(8)), Device: dev, Skip: 1}).Run(); err == nil || !strings.Contains(err.Error(), "activation_checkpoint") {
		t.Errorf("printed main config alone: err = %v", err)
	}
	// So is the same JSON given as --job-config.
	path := t.TempDir() + "/printed.json"
	_, js, _ := strings.Cut(printed(8), "Running with configs: ")
	if err := os.WriteFile(path, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadJobConfig(path); err == nil || !strings.Contains(err.Error(), "activation_checkpoint") {
		t.Errorf("--job-config printed.json: err = %v", err)
	}
}
