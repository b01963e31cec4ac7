package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
)

func trainJSON(t *testing.T, args ...string) trainReport {
	t.Helper()
	var out, errb bytes.Buffer
	args = append([]string{"train", "--model", "tiny", "--seq", "8", "--json", "--peak-gflops", "100"}, args...)
	if err := run(&out, &errb, args); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, errb.String())
	}
	var rep trainReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out.String())
	}
	return rep
}

func TestTrainJSON(t *testing.T) {
	rep := trainJSON(t, "--gpus", "4", "--ep", "2", "--dp-replicate", "2", "--lbs", "2", "--steps", "2", "--grad-accum", "2")
	if len(rep.Losses) != 2 || len(rep.PeakBytesPerRank) != 4 {
		t.Fatalf("losses %v, peak_bytes_per_rank %v: want 2 and 4 entries", rep.Losses, rep.PeakBytesPerRank)
	}
	for _, l := range rep.Losses {
		// A fresh model predicts about uniformly over the 64-token vocabulary: ln 64 ≈ 4.16.
		if l < 3 || l > 5 {
			t.Errorf("loss %g far from ln 64", l)
		}
	}
	for _, k := range []string{"all_gather", "reduce_scatter", "all_reduce", "all_to_all"} {
		if rep.CommBytes[k] <= 0 {
			t.Errorf("comm_bytes[%s] = %d, want > 0 (HSDP with EP uses it)", k, rep.CommBytes[k])
		}
	}
	if !(rep.MFU > 0 && rep.MFU < 1) || !(rep.TPS > 0) {
		t.Errorf("mfu %g tps %g", rep.MFU, rep.TPS)
	}
	for r, b := range rep.PeakBytesPerRank {
		if b <= 0 {
			t.Errorf("rank %d peak %d bytes", r, b)
		}
	}
}

// TestTrainResume: 2 steps, a checkpoint, then 2 more steps from it in
// another layout of the same global batch give the losses of 4 uninterrupted
// steps. Both layouts are single-replica FSDP without EP, whose reduction
// order is one rank's, so the losses agree bit for bit.
func TestTrainResume(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	full := trainJSON(t, "--gpus", "2", "--lbs", "1", "--grad-accum", "2", "--steps", "4")
	first := trainJSON(t, "--gpus", "2", "--lbs", "1", "--grad-accum", "2", "--steps", "2", "--checkpoint", dir)
	rest := trainJSON(t, "--gpus", "4", "--lbs", "1", "--steps", "2", "--resume", dir)
	got := append(first.Losses, rest.Losses...)
	if rest.StartStep != 2 {
		t.Errorf("resumed at step %d, want 2", rest.StartStep)
	}
	for i := range full.Losses {
		if got[i] != full.Losses[i] {
			t.Errorf("step %d: loss %.17g after resume, %.17g uninterrupted", i+1, got[i], full.Losses[i])
		}
	}
	// Refusals: overwriting without --force, and a different global batch.
	var out, errb bytes.Buffer
	err := run(&out, &errb, []string{"train", "--model", "tiny", "--seq", "8", "--gpus", "1", "--lbs", "1", "--steps", "1",
		"--peak-gflops", "100", "--checkpoint", dir})
	if err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("overwrite: err = %v", err)
	}
	err = run(&out, &errb, []string{"train", "--model", "tiny", "--seq", "8", "--gpus", "1", "--lbs", "1", "--steps", "1",
		"--peak-gflops", "100", "--resume", dir})
	if err == nil || !strings.Contains(err.Error(), "global batch 4") {
		t.Errorf("other global batch: err = %v", err)
	}
}

func TestTrainBadInput(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--gpus", "2", "--lbs", "0", "--seq", "8", "--steps", "1"}, "--lbs = 0"},
		{[]string{"--gpus", "2", "--lbs", "1", "--seq", "8", "--steps", "0"}, "--steps = 0"},
		{[]string{"--gpus", "6", "--ep", "4", "--lbs", "1", "--seq", "8", "--steps", "1"}, "ep = 4 does not divide dp_shard = 6"},
		{[]string{"--gpus", "8", "--ep", "8", "--lbs", "1", "--seq", "8", "--steps", "1"}, "ep = 8 does not divide experts = 4"},
		{[]string{"--lbs", "1", "--seq", "8", "--steps", "1"}, "--gpus is required"},
		{[]string{"--gpus", "2", "--lbs", "1", "--seq", "8", "--steps", "1", "--ac", "layer:0"}, "layer:N"},
		{[]string{"--gpus", "2", "--lbs", "1", "--seq", "8", "--steps", "1", "--host-memory-gib", "0.0001"}, "host memory"},
		// Non-finite or out-of-range floats once trained to NaN losses or
		// printed a NaN MFU (or, for host memory, disabled the guard).
		{[]string{"--gpus", "1", "--lbs", "1", "--seq", "8", "--steps", "1", "--aux-coef", "NaN"}, "--aux-coef = NaN"},
		{[]string{"--gpus", "1", "--lbs", "1", "--seq", "8", "--steps", "1", "--aux-coef", "1e300"}, "--aux-coef = 1e+300"},
		{[]string{"--gpus", "1", "--lbs", "1", "--seq", "8", "--steps", "1", "--peak-gflops", "NaN"}, "--peak-gflops = NaN"},
		{[]string{"--gpus", "1", "--lbs", "1", "--seq", "8", "--steps", "1", "--peak-gflops", "Inf"}, "--peak-gflops = +Inf"},
		{[]string{"--gpus", "1", "--lbs", "1", "--seq", "8", "--steps", "1", "--host-memory-gib", "NaN"}, "--host-memory-gib = NaN"},
		// Activations once went unguarded (the run was killed for memory):
		// 1024 × 65536 = 2^26 tokens of tiny's D = 32 make one [T, D]
		// float32 tensor 2^26·32·4 B = 8 GiB, and a block saves at least two
		// (its two norms' inputs): over the default 16 GiB.
		{[]string{"--gpus", "1", "--lbs", "1024", "--seq", "65536", "--steps", "1"}, "for activations"},
		// FSDP padding grows with the world: at dp_shard 4096 a tensor of
		// fewer than 4096 rows is padded to 4096 rows on every rank, so
		// tiny's [64, 32] embedding alone takes 4096·32·4 B = 512 KiB per
		// rank, 2 GiB over 4096 ranks, and its 2 blocks' eight attention
		// projections (inner dim ≥ 32) as much again each: ≥ 18 GiB, over
		// the default 16 GiB (such a run was killed for memory at 24 GiB).
		{[]string{"--gpus", "4096", "--lbs", "1", "--seq", "8", "--steps", "1"}, "padded gathered weights"},
	}
	for _, tc := range cases {
		var out, errb bytes.Buffer
		err := run(&out, &errb, append([]string{"train", "--model", "tiny", "--peak-gflops", "100"}, tc.args...))
		if err == nil || !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want a usage error containing %q", tc.args, err, tc.want)
		}
	}
}

func TestTrainSchedule(t *testing.T) {
	var out, errb bytes.Buffer
	err := run(&out, &errb, []string{"train", "--model", "tiny", "--gpus", "4", "--ep", "2", "--lbs", "1", "--seq", "8", "--steps", "1", "--schedule"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"all_gather param_gather on dp_shard", "all_to_all dispatch on ep", "reduce_scatter grad_reduce on efsdp", "optimizer update"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("schedule lacks %q:\n%s", want, out.String())
		}
	}
}

// TestTrainCheckpointRefusedFirst: a --checkpoint that exists (without
// --force) or whose directory is missing is refused before any step runs,
// and the existing directory is left as it was.
func TestTrainCheckpointRefusedFirst(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	if err := os.Mkdir(ck, 0o755); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(ck, "keep")
	if err := os.WriteFile(marker, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"train", "--model", "tiny", "--peak-gflops", "100", "--gpus", "1", "--lbs", "1", "--seq", "8", "--steps", "1"}
	var out, errb bytes.Buffer
	err := run(&out, &errb, append(base, "--checkpoint", ck))
	if !errors.Is(err, fileio.ErrExists) {
		t.Errorf("existing --checkpoint: err = %v, want ErrExists", err)
	}
	if strings.Contains(out.String(), "step 1") {
		t.Errorf("trained before refusing:\n%s", out.String())
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "x" {
		t.Errorf("existing checkpoint directory touched: %q, %v", b, err)
	}
	out.Reset()
	err = run(&out, &errb, append(base, "--checkpoint", filepath.Join(dir, "missing", "ck")))
	if err == nil || !strings.Contains(err.Error(), "does not exist") || strings.Contains(out.String(), "step 1") {
		t.Errorf("--checkpoint in a missing directory: err = %v, output %q; want a refusal before training", err, out.String())
	}
}

// TestTrainResumeCorrupt: a checkpoint whose train_state.json holds a
// negative or enormous step (which indexes the data and AdamW's bias
// correction) or not one loss per step is refused, naming the field; these
// once resumed at "step -4" or "step 4611686018427387905".
func TestTrainResumeCorrupt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	trainJSON(t, "--gpus", "1", "--lbs", "1", "--steps", "2", "--checkpoint", dir)
	statePath := filepath.Join(dir, "train_state.json")
	orig, err := os.ReadFile(statePath)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		step   int64
		losses []float64
		want   string
	}{
		{-5, nil, "step = -5: must be in [0, 4194304]"},
		{1 << 62, nil, "step = 4611686018427387904: must be in [0, 4194304]"},
		{2, []float64{4}, "1 losses for step = 2"},
	} {
		var st map[string]any
		if err := json.Unmarshal(orig, &st); err != nil {
			t.Fatal(err)
		}
		st["step"] = c.step
		if c.losses != nil {
			st["losses"] = c.losses
		}
		b, _ := json.Marshal(st)
		if err := os.WriteFile(statePath, b, 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		err := run(&out, &errb, []string{"train", "--model", "tiny", "--seq", "8", "--gpus", "1", "--lbs", "1", "--steps", "1",
			"--peak-gflops", "100", "--resume", dir})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("step %d, losses %v: err = %v, want one containing %q", c.step, c.losses, err, c.want)
		}
	}
}

// TestTrainDeepseekAux: train adds DeepSeek-MoE's per-sequence aux loss
// (aux_loss_alpha of testdata/torchref/deepseek, the config checked against
// PyTorch by moe/hf's TestTorchref). A step's aux loss is the mean over its
// micro-batches of each one's loss (DESIGN.md, "Losses"), so 2 ranks at
// lbs 2 and 1 rank with grad-accum 2 report the aux loss that ref.Model's
// Accumulate gives on the same four sequences (parallel.Batch.Sequences)
// from the same initialization.
func TestTrainDeepseekAux(t *testing.T) {
	model := filepath.Join("..", "..", "testdata", "torchref", "deepseek", "config.json")
	cfg, err := hf.Load(model)
	if err != nil {
		t.Fatal(err)
	}
	m, err := ref.NewModel[float32](cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.InitRandom(0)
	b := parallel.Batch{LBS: 2, Seq: 8, GradAccum: 1, DP: 2}
	var micro [][][]int
	for r := 0; r < b.DP; r++ {
		var mb [][]int
		for _, s := range b.Sequences(0, cfg.Vocab, 0, 0, r) {
			ids := make([]int, len(s))
			for i, id := range s {
				ids[i] = int(id)
			}
			mb = append(mb, ids)
		}
		micro = append(micro, mb)
	}
	want, err := m.Accumulate(micro, ref.Options{AuxCoef: cfg.AuxLossCoef})
	if err != nil {
		t.Fatal(err)
	}
	for _, layout := range [][]string{{"--gpus", "2", "--lbs", "2"}, {"--gpus", "1", "--lbs", "2", "--grad-accum", "2"}} {
		var out, errb bytes.Buffer
		args := append([]string{"train", "--model", model, "--seq", "8", "--steps", "1", "--json", "--peak-gflops", "100"}, layout...)
		if err := run(&out, &errb, args); err != nil {
			t.Fatalf("%v: %v\n%s", layout, err, errb.String())
		}
		var rep trainReport
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatalf("%v: %v", layout, err)
		}
		if len(rep.AuxLosses) != 1 || math.Abs(rep.AuxLosses[0]-want.Aux) > 1e-6*want.Aux || want.Aux == 0 {
			t.Errorf("%v: aux losses %v, want [%v] (ref.Model.Accumulate)", layout, rep.AuxLosses, want.Aux)
		}
	}
}

// TestTrainAbsurdPeakGFLOPSRefused (issue 17, defect 10): --peak-gflops
// 1e-300 printed an MFU of 10^300 %; a given peak must be in [1e-3, 1e7]
// GFLOP/s (0 = measure), so the MFU printed is finite.
func TestTrainAbsurdPeakGFLOPSRefused(t *testing.T) {
	for _, v := range []string{"1e-300", "1e-4", "1e300", "1.1e7", "-1", "NaN", "Inf"} {
		var out, errb bytes.Buffer
		err := run(&out, &errb, []string{"train", "--model", "tiny", "--gpus", "1", "--lbs", "1", "--seq", "8", "--steps", "1", "--peak-gflops", v})
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "--peak-gflops = ") ||
			!strings.Contains(err.Error(), "must be in [0.001, 1e+07] GFLOP/s (0 = measure)") {
			t.Errorf("--peak-gflops %s: exit %d, error %v", v, exitCode(err), err)
		}
	}
	for _, v := range []string{"1e-3", "1e7"} {
		rep := trainJSON(t, "--gpus", "1", "--lbs", "1", "--steps", "1", "--peak-gflops", v)
		if !(rep.MFU > 0) || math.IsInf(rep.MFU, 0) || rep.PeakGFLOPS != map[string]float64{"1e-3": 1e-3, "1e7": 1e7}[v] {
			t.Errorf("--peak-gflops %s (a bound): mfu %g peak %g", v, rep.MFU, rep.PeakGFLOPS)
		}
	}
}

// TestTrainTP: train --tp 2 prints the losses of one rank on the same
// global batch (the tp ranks share their data-parallel rank's sequences),
// alone, with dp_shard 2, with ep 2 borrowing the tp ranks (etp 1) and
// with ep 2 over dp_shard at etp 2, within 1e-5 relative (the row-parallel
// linears sum partial products in another order than one rank's GEMM,
// TestNumericTPEqualsOneRank); a sequence tp cannot split is refused by
// name. Two sequences per micro-batch: with
// tiny's initialization one sequence of 8 tokens leaves the q/k
// projections' gradients at about 1e-9, the float32 rounding level of the
// partial sums, and AdamW turns that noise into ±lr updates (the losses
// then drift 4e-5 apart by step 2).
func TestTrainTP(t *testing.T) {
	for _, c := range []struct{ one, tp []string }{
		{[]string{"--gpus", "1", "--lbs", "2", "--steps", "3"}, []string{"--gpus", "2", "--tp", "2", "--lbs", "2", "--steps", "3"}},
		{[]string{"--gpus", "1", "--lbs", "2", "--grad-accum", "2", "--steps", "3"},
			[]string{"--gpus", "4", "--tp", "2", "--dp-shard", "2", "--lbs", "2", "--steps", "3"}},
		{[]string{"--gpus", "1", "--lbs", "2", "--steps", "3"}, []string{"--gpus", "2", "--tp", "2", "--ep", "2", "--lbs", "2", "--steps", "3"}},
		{[]string{"--gpus", "1", "--lbs", "2", "--grad-accum", "2", "--steps", "3"},
			[]string{"--gpus", "4", "--tp", "2", "--ep", "2", "--etp", "2", "--lbs", "2", "--steps", "3"}},
	} {
		one, tp := trainJSON(t, c.one...), trainJSON(t, c.tp...)
		if len(one.Losses) != 3 || len(tp.Losses) != 3 {
			t.Fatalf("%v: losses %v and %v, want 3 each", c.tp, one.Losses, tp.Losses)
		}
		// TPS counts a rank's own tokens, half its group's (3 steps × 2
		// sequences × 8 tokens ÷ tp 2 per rank; torchtitan's division by
		// the non-data-parallel degrees).
		if own := tp.TPS * tp.Seconds; math.Abs(own-24) > 1e-9*24 {
			t.Errorf("%v: tps × seconds = %g tokens per rank, want 24", c.tp, own)
		}
		for i := range one.Losses {
			if math.Abs(tp.Losses[i]-one.Losses[i]) > 1e-5*math.Abs(one.Losses[i]) {
				t.Errorf("%v step %d: loss %.9g, one rank %.9g", c.tp, i+1, tp.Losses[i], one.Losses[i])
			}
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--gpus", "2", "--tp", "2", "--seq", "6"}, "seq = 6 is not divisible by tp × 2·cp"},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"train", "--model", "tiny", "--seq", "8", "--lbs", "1", "--steps", "1", "--peak-gflops", "100"}, c.args...)
		if err := run(&out, &errb, args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want a refusal saying %q", c.args, err, c.want)
		}
	}
}

// TestTrainTPResume: a checkpoint written by tp ranks (each saving its
// pieces, reassembled whole) resumes on one rank, and one rank's resumes
// under tp with ep, continuing the losses of an uninterrupted one-rank run
// within 1e-5 relative (tp's summation order).
func TestTrainTPResume(t *testing.T) {
	full := trainJSON(t, "--gpus", "1", "--lbs", "2", "--steps", "4")
	for _, c := range []struct{ first, rest []string }{
		{[]string{"--gpus", "2", "--tp", "2"}, []string{"--gpus", "1"}},
		{[]string{"--gpus", "1"}, []string{"--gpus", "2", "--tp", "2", "--ep", "2"}},
	} {
		dir := filepath.Join(t.TempDir(), "ckpt")
		first := trainJSON(t, append(c.first, "--lbs", "2", "--steps", "2", "--checkpoint", dir)...)
		rest := trainJSON(t, append(c.rest, "--lbs", "2", "--steps", "2", "--resume", dir)...)
		got := append(first.Losses, rest.Losses...)
		for i := range full.Losses {
			if math.Abs(got[i]-full.Losses[i]) > 1e-5*math.Abs(full.Losses[i]) {
				t.Errorf("%v then %v, step %d: loss %.9g, uninterrupted %.9g", c.first, c.rest, i+1, got[i], full.Losses[i])
			}
		}
	}
}

// TestTrainPipelineTP: train --pp 2 --tp 2 --gpus 4 and train --pp 2 --tp
// 2 --dp-shard 2 --gpus 8, alone and with --ep 2 (at etp 1 EP borrows the
// stage's tp ranks; at --etp 2 its dp_shard ranks, each expert split over
// tp, under ZBVZeroBubble), print the losses of train --gpus 1 on the same
// micro-batches (PipelineTrainer's doc: lbs 4 in pipeline micro-batches of
// 2 sequences are one rank's micro-steps of 2, grad-accum 2 per
// data-parallel rank), within 1e-5 relative as TestTrainTP; TPS counts a
// rank's own tokens, ÷ pp · tp (3 steps × lbs 4 × 8 tokens ÷ 4 = 24).
func TestTrainPipelineTP(t *testing.T) {
	for _, c := range []struct{ one, pp []string }{
		{[]string{"--gpus", "1", "--lbs", "2", "--grad-accum", "2", "--steps", "3"},
			[]string{"--gpus", "4", "--pp", "2", "--tp", "2", "--lbs", "4", "--pp-microbatch-size", "2", "--steps", "3"}},
		{[]string{"--gpus", "1", "--lbs", "2", "--grad-accum", "4", "--steps", "3"},
			[]string{"--gpus", "8", "--pp", "2", "--tp", "2", "--dp-shard", "2", "--lbs", "4", "--pp-microbatch-size", "2", "--steps", "3"}},
		{[]string{"--gpus", "1", "--lbs", "2", "--grad-accum", "2", "--steps", "3"},
			[]string{"--gpus", "4", "--pp", "2", "--tp", "2", "--ep", "2", "--lbs", "4", "--pp-microbatch-size", "2", "--steps", "3"}},
		{[]string{"--gpus", "1", "--lbs", "2", "--grad-accum", "4", "--steps", "3"},
			[]string{"--gpus", "8", "--pp", "2", "--tp", "2", "--ep", "2", "--etp", "2", "--dp-shard", "2", "--lbs", "4", "--pp-microbatch-size", "2",
				"--pp-schedule", "ZBVZeroBubble", "--steps", "3"}},
	} {
		one, pp := trainJSON(t, c.one...), trainJSON(t, c.pp...)
		if len(one.Losses) != 3 || len(pp.Losses) != 3 {
			t.Fatalf("%v: losses %v and %v, want 3 each", c.pp, one.Losses, pp.Losses)
		}
		for i := range one.Losses {
			if math.Abs(pp.Losses[i]-one.Losses[i]) > 1e-5*math.Abs(one.Losses[i]) {
				t.Errorf("%v step %d: loss %.9g, one rank %.9g", c.pp, i+1, pp.Losses[i], one.Losses[i])
			}
		}
		if own := pp.TPS * pp.Seconds; math.Abs(own-24) > 1e-9*24 {
			t.Errorf("%v: tps × seconds = %g tokens per rank, want 24", c.pp, own)
		}
	}
}
