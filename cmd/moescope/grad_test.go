package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/memory/host"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/kernel"
	"github.com/moescope/moescope/moe/ref"
)

func TestGradInitSave(t *testing.T) {
	dir := t.TempDir()
	w := filepath.Join(dir, "w.safetensors")
	model := filepath.Join("..", "..", "testdata", "torchref", "moe", "config.json")
	var out, errb bytes.Buffer
	if err := run(&out, &errb, []string{"grad", "--model", model, "--init", "3", "--save", w}); err != nil {
		t.Fatal(err, errb.String())
	}
	first, _ := os.ReadFile(w)
	err := run(&out, &errb, []string{"grad", "--model", model, "--init", "3", "--save", w})
	if !errors.Is(err, fileio.ErrExists) {
		t.Errorf("second --save without --force: %v", err)
	}
	if err := run(&out, &errb, []string{"grad", "--model", model, "--init", "3", "--save", w, "--force"}); err != nil {
		t.Fatal(err)
	}
	second, _ := os.ReadFile(w)
	if !bytes.Equal(first, second) {
		t.Error("--init 3 wrote different files")
	}
	cfg, _ := hf.Load(model)
	ps, err := hf.LoadParams[float64](w, cfg)
	if err != nil {
		t.Fatalf("saved init does not load: %v", err)
	}
	// HF's _init_weights: matrices ~ N(0, initializer_range²), RMSNorm
	// weights 1, biases 0. For n normal samples the sample mean has sd σ/√n
	// and the sample std a relative sd of about 1/√(2n); allow 5 of each.
	var n int
	var sum, sq float64
	for i, p := range cfg.Params() {
		for _, v := range ps[i] {
			switch {
			case p.Group == moe.GroupNorm && v != 1:
				t.Fatalf("%s = %v, want 1", p.Name, v)
			case p.Group != moe.GroupNorm && len(p.Shape) == 2:
				n++
				sum += v
				sq += v * v
			}
		}
	}
	mean, std, sigma := sum/float64(n), math.Sqrt(sq/float64(n)), cfg.InitRange
	if math.Abs(mean) > 5*sigma/math.Sqrt(float64(n)) || math.Abs(std/sigma-1) > 5/math.Sqrt(2*float64(n)) {
		t.Errorf("n = %d: mean %g, std %g; want 0 and %g", n, mean, std, sigma)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"grad", "--init", "1", "--save", w}, "--model is required"},
		{[]string{"grad", "--model", model, "--save", w}, "exactly one of --weights and --init"},
		{[]string{"grad", "--model", model, "--weights", w, "--init", "1"}, "exactly one of --weights and --init"},
		{[]string{"grad", "--model", model, "--weights", w, "--save", w}, "needs --init"},
		{[]string{"grad", "--model", model, "--weights", w}, "nothing to do"},
		{[]string{"grad", "--model", model, "--weights", w, "--out", "x"}, "--out needs --tokens"},
		{[]string{"grad", "--model", model, "--weights", w, "--tokens", "t", "--ac", "some"}, "--ac"},
	} {
		err := run(&out, &errb, c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) || exitCode(err) != 2 {
			t.Errorf("%v: error %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
}

// TestGradMatchesTorch runs `moescope grad` on the checkpoints the PyTorch
// script testdata/torchref/torchref.py wrote (BF16, F16, F32, sharded) and
// compares its JSON losses and its gradient file with the script's: loss
// relative 1e-5, every gradient's max abs difference ≤ 1e-4 × its max abs
// value. The references follow HF (input_ids = labels = tokens), aux loss
// over every token's routing included.
func TestGradMatchesTorch(t *testing.T) {
	for _, name := range []string{"dense", "moe", "shared", "sigmoid", "window", "aux", "gqa", "mla_v3", "mla_v2", "yarn_v3", "yarn_moe", "gpt_oss", "llama4"} {
		t.Run(name, func(t *testing.T) {
			got, exp, worst, worstName := gradAgainstTorch(t, filepath.Join("..", "..", "testdata", "torchref", name))
			if rel(got.Loss, exp.Loss) > 1e-5 || rel(got.TotalLoss, exp.TotalLoss) > 1e-5 || got.AuxAdded != exp.AuxAdded {
				t.Errorf("got %+v, want loss %v, total %v, aux added %v", got, exp.Loss, exp.TotalLoss, exp.AuxAdded)
			}
			if exp.AuxAdded && rel(got.AuxLoss, exp.AuxLoss) > 1e-5 {
				t.Errorf("aux_loss %v, want %v", got.AuxLoss, exp.AuxLoss)
			}
			t.Logf("loss rel %.2e, aux %v vs %v, worst gradient %.2e × max (%s)", rel(got.Loss, exp.Loss), got.AuxLoss, exp.AuxLoss, worst, worstName)
		})
	}
}

// torchExpected is a PyTorch reference's expected.json (torchref.py).
type torchExpected struct {
	Loss      float64 `json:"loss"`
	AuxLoss   float64 `json:"aux_loss"`
	TotalLoss float64 `json:"total_loss"`
	AuxAdded  bool    `json:"aux_added"`
	AuxCoef   float64 `json:"aux_coef"`
}

func rel(a, b float64) float64 { return math.Abs(a-b) / math.Abs(b) }

// gradAgainstTorch runs `moescope grad` on the reference in dir and
// compares its gradient file with the script's: every gradient's max abs
// difference ≤ 1e-4 × its max abs value (a buffer's gradient exactly 0).
// It returns grad's report, the script's expected losses and the worst
// gradient ratio with its tensor.
func gradAgainstTorch(t *testing.T, dir string) (got gradReport, exp torchExpected, worst float64, worstName string) {
	t.Helper()
	model := filepath.Join(dir, "config.json")
	g := filepath.Join(t.TempDir(), "g.safetensors")
	var out, errb bytes.Buffer
	if err := run(&out, &errb, []string{"grad", "--model", model, "--weights", dir,
		"--tokens", filepath.Join(dir, "tokens.json"), "--out", g}); err != nil {
		t.Fatal(err, errb.String())
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("output %q: %v", out.String(), err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "expected.json"))
	if err := json.Unmarshal(b, &exp); err != nil {
		t.Fatal(err)
	}
	cfg, err := hf.Load(model)
	if err != nil {
		t.Fatal(err)
	}
	gg, err := hf.LoadParams[float64](g, cfg)
	if err != nil {
		t.Fatal(err)
	}
	torch, err := hf.LoadParams[float64](filepath.Join(dir, "grads.safetensors"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range cfg.Params() {
		var maxRef, maxDiff float64
		for j, v := range torch[i] {
			maxRef = math.Max(maxRef, math.Abs(v))
			maxDiff = math.Max(maxDiff, math.Abs(gg[i][j]-v))
		}
		if maxRef == 0 && maxDiff != 0 {
			t.Errorf("%s: gradient should be zero (buffer), max |g| = %g", p.Name, maxDiff)
		} else if q := maxDiff / math.Max(maxRef, 1e-300); q > worst {
			worst, worstName = q, p.Name
		}
	}
	if worst > 1e-4 {
		t.Errorf("gradient of %s: max abs diff %.3g × its max abs value; want ≤ 1e-4", worstName, worst)
	}
	return got, exp, worst, worstName
}

func TestGradBadInput(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "torchref", "moe")
	model := filepath.Join(dir, "config.json")
	tmp := t.TempDir()
	n := 0
	tok := func(s string) string {
		n++
		p := filepath.Join(tmp, fmt.Sprintf("t%d.json", n))
		os.WriteFile(p, []byte(s), 0o644)
		return p
	}
	existing := filepath.Join(tmp, "exists")
	os.WriteFile(existing, []byte("keep"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tokens", tok(`[[1,2,3],[4,5]]`)}, "sequences must have equal length"},
		{[]string{"--tokens", tok(`[[1,2,3],[4,5,99]]`)}, "token id 99 is not an integer in [0, vocab_size = 24)"},
		{[]string{"--tokens", tok(`[[1,2,3]]`), "--out", existing}, "file exists"},
		{[]string{"--tokens", filepath.Join(tmp, "absent.json")}, "no such file"},
	} {
		var out, errb bytes.Buffer
		err := run(&out, &errb, append([]string{"grad", "--model", model, "--weights", dir}, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one containing %q", c.args, err, c.want)
		}
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep" {
		t.Error("an existing --out file was overwritten without --force")
	}
	// A checkpoint for another model is refused with the names that differ.
	var out, errb bytes.Buffer
	err := run(&out, &errb, []string{"grad", "--model", filepath.Join("..", "..", "testdata", "torchref", "window", "config.json"),
		"--weights", dir, "--tokens", tok(`[[1,2,3]]`)})
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("mismatched checkpoint: %v", err)
	}
}

// TestGradDeepseekAux: DeepSeek-MoE's own aux loss (MoEGate, seq_aux,
// aux_loss_alpha) is added as its modeling_deepseek.py trains on it: loss,
// aux loss and gradient file equal those of the PyTorch reference
// testdata/torchref/deepseek (torchref.py's DeepSeek-MoE transcription) to
// TestGradMatchesTorch's bounds; with aux_loss_alpha 0 nothing is added.
func TestGradDeepseekAux(t *testing.T) {
	got, exp, _, _ := gradAgainstTorch(t, filepath.Join("..", "..", "testdata", "torchref", "deepseek"))
	if !got.AuxAdded || got.AuxCoef != exp.AuxCoef || rel(got.Loss, exp.Loss) > 1e-5 ||
		rel(got.AuxLoss, exp.AuxLoss) > 1e-5 || rel(got.TotalLoss, exp.TotalLoss) > 1e-5 {
		t.Errorf("got %+v, want loss %v, aux_loss %v, total %v, aux_coef %v added", got, exp.Loss, exp.AuxLoss, exp.TotalLoss, exp.AuxCoef)
	}

	var out, errb bytes.Buffer
	// aux_loss_alpha 0: MoEGate computes no aux loss.
	tmp := t.TempDir()
	conf := filepath.Join(tmp, "ds.json")
	os.WriteFile(conf, []byte(`{"model_type": "deepseek", "vocab_size": 16, "hidden_size": 8,
		"intermediate_size": 12, "moe_intermediate_size": 4, "num_hidden_layers": 2, "num_attention_heads": 2,
		"num_key_value_heads": 2, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
		"first_k_dense_replace": 1, "aux_loss_alpha": 0}`), 0o644)
	tok := filepath.Join(tmp, "t.json")
	os.WriteFile(tok, []byte(`[[1,2,3,4]]`), 0o644)
	out.Reset()
	if err := run(&out, &errb, []string{"grad", "--model", conf, "--init", "1", "--tokens", tok}); err != nil {
		t.Fatalf("deepseek with aux_loss_alpha 0: %v", err)
	}
	var r gradReport
	// With weights ~ N(0, 0.02²) the logits are near 0, so the cross-entropy
	// is near ln(vocab) = ln 16 ≈ 2.7726.
	if err := json.Unmarshal(out.Bytes(), &r); err != nil || r.AuxAdded || math.Abs(r.Loss-math.Log(16)) > 0.05 {
		t.Errorf("report %q: %+v, %v", out.String(), r, err)
	}
}

// TestGradPoliciesBitwise: the checkpointing policy changes what is kept
// and recomputed, never the numbers — the gradient files are byte-identical
// (on the three-pass aux path too).
func TestGradPoliciesBitwise(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "torchref", "aux")
	tmp := t.TempDir()
	var first []byte
	for _, ac := range []string{"none", "selective", "full", "layer:2", "layer:1"} {
		g := filepath.Join(tmp, strings.ReplaceAll(ac, ":", "")+".safetensors")
		var out, errb bytes.Buffer
		if err := run(&out, &errb, []string{"grad", "--model", filepath.Join(dir, "config.json"), "--weights", dir,
			"--tokens", filepath.Join(dir, "tokens.json"), "--ac", ac, "--out", g}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = b
		} else if !bytes.Equal(b, first) {
			t.Errorf("--ac %s: gradient file differs from --ac none", ac)
		}
	}
}

// TestGradMemoryGuard: a built-in 30B model is refused with a message
// instead of an out-of-memory crash when memory is short, and the byte
// count is 12 per parameter (float32 values, gradients and the loaded copy).
func TestGradMemoryGuard(t *testing.T) {
	cfg, err := hf.Load("qwen3-30b-a3b")
	if err != nil {
		t.Fatal(err)
	}
	need, err := host.GradParamBytes(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, p := range cfg.Params() {
		n += uint64(p.Elements())
	}
	if need != 12*n {
		t.Errorf("need %d bytes for %d parameters, want 12 each", need, n)
	}
	if err := checkGradMemory(cfg, hostLimit{flagGiB: 1 << 20, avail: 64 << 30}); err == nil || !strings.Contains(err.Error(), "64.0 GiB of memory available (MemAvailable") {
		t.Errorf("30B model with 64 GiB available: %v", err)
	}
	if err := checkGradMemory(cfg, hostLimit{flagGiB: 64}); err == nil || !strings.Contains(err.Error(), "--host-memory-gib = 64") {
		t.Errorf("30B model with --host-memory-gib 64: %v", err)
	}
	if err := checkGradMemory(cfg, hostLimit{flagGiB: float64(need)/(1<<30) + 1}); err != nil {
		t.Errorf("a limit above the need must not refuse: %v", err)
	}
	if kernel.AvailableMemory() == 0 {
		t.Log("no /proc/meminfo here: the guard is off")
	}
}

// TestGradNonFinite: a checkpoint holding NaN is refused naming the tensor,
// and finite weights whose forward pass overflows float32 give an error,
// not a JSON encoder failure ("json: unsupported value: NaN").
func TestGradNonFinite(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	m, err := ref.NewModel[float32](cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.InitRandom(1)
	tmp := t.TempDir()
	tokens := filepath.Join(tmp, "t.json")
	os.WriteFile(tokens, []byte(`[[1,2,3]]`), 0o644)
	for _, c := range []struct {
		name string
		v    float32
		want string
	}{
		{"nan", float32(math.NaN()), "tensor lm_head.weight holds NaN at element 5"},
		{"inf", float32(math.Inf(-1)), "tensor lm_head.weight holds -Inf at element 5"},
		// Every LM-head weight 3e38: each logit sums 32 products of about
		// that size and overflows float32.
		{"huge", 3e38, "not finite"},
	} {
		ts := m.Tensors()
		head := ts[len(ts)-1]
		if cfg.Params()[len(ts)-1].Name != "lm_head.weight" {
			t.Fatalf("last parameter is %s", cfg.Params()[len(ts)-1].Name)
		}
		if c.name == "huge" {
			for i := range head {
				head[i] = c.v
			}
		} else {
			head[5] = c.v
		}
		w := filepath.Join(tmp, c.name+".safetensors")
		if err := hf.SaveParams(w, cfg, ts, moe.F32, false); err != nil {
			t.Fatal(err)
		}
		m.InitRandom(1)
		var out, errb bytes.Buffer
		err := run(&out, &errb, []string{"grad", "--model", "tiny", "--weights", w, "--tokens", tokens})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q; stdout %q", c.name, err, c.want, out.String())
		}
	}
}

// TestGradActivationGuard: a token file whose activations cannot fit is
// refused before running. Lower bound by hand for the tiny model (D = 32,
// V = 64): the float32 logits alone are 4·V = 256 bytes per token, so
// 3000 × 3000 tokens need more than 2.3 GB, above a 2 GiB machine.
func TestGradActivationGuard(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	none := moe.AC{Mode: moe.ACNone}
	if err := checkGradActivations(cfg, 3000, 3000, none, hostLimit{flagGiB: 2}); err == nil || !strings.Contains(err.Error(), "3000 sequences × 3000 tokens need about") {
		t.Errorf("9M tokens with 2 GiB: %v", err)
	}
	if err := checkGradActivations(cfg, 2, 3, none, hostLimit{flagGiB: 2}); err != nil {
		t.Errorf("6 tokens with 2 GiB: %v", err)
	}
	// Token counts past what byte counts can hold are an error, not a wrap:
	// the batch's limits (job.Batch: lbs and seq ≤ 2^24) refuse them.
	if err := checkGradActivations(cfg, 1<<30, 1<<30, none, hostLimit{flagGiB: 1 << 40}); err == nil || !strings.Contains(err.Error(), "seq = 1073741824: must be in [1, 16777216]") {
		t.Errorf("2^60 tokens: %v", err)
	}
}

// TestGradHasMemoryGuard is issue 17's defect 6: 256 sequences × 4096
// tokens on the tiny model grew past 5 GB with no guard. grad now refuses
// them before running, as train does, naming the flag, the estimate and
// the limit. Lower bound by hand for the estimate: the float32 logits and
// their gradient, 2 · 4 B · V = 512 B per token for V = 64, are 0.5 GiB
// of the 2^20 tokens; the refusal must quote more than the 0.25 GiB limit.
func TestGradHasMemoryGuard(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "t.json")
	var b strings.Builder
	b.WriteString("[")
	for i := 0; i < 256; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("[")
		for j := 0; j < 4096; j++ {
			if j > 0 {
				b.WriteString(",")
			}
			b.WriteString(strconv.Itoa((i + j) % 64))
		}
		b.WriteString("]")
	}
	b.WriteString("]")
	if err := os.WriteFile(tokens, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	err := run(&out, &errb, []string{"grad", "--model", "tiny", "--init", "1", "--tokens", tokens, "--host-memory-gib", "0.25"})
	if err == nil || exitCode(err) != 2 {
		t.Fatalf("grad ran 256 × 4096 tokens under a 0.25 GiB limit: %v", err)
	}
	msg := err.Error()
	for _, want := range []string{"256 sequences × 4096 tokens need about", "--host-memory-gib = 0.25", "--ac selective"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	m := regexp.MustCompile(`need about ([0-9.]+) GiB`).FindStringSubmatch(msg)
	if m == nil {
		t.Fatalf("no estimate in %q", msg)
	}
	if gib, _ := strconv.ParseFloat(m[1], 64); gib < 0.5 {
		t.Errorf("estimate %s GiB is below the logits' 0.5 GiB", m[1])
	}
	if out.Len() != 0 {
		t.Errorf("refused run printed %q", out.String())
	}
	for _, bad := range []string{"0", "-1", "NaN", "+Inf"} {
		err := run(&out, &errb, []string{"grad", "--model", "tiny", "--init", "1", "--tokens", tokens, "--host-memory-gib", bad})
		if err == nil || !strings.Contains(err.Error(), "--host-memory-gib = ") {
			t.Errorf("--host-memory-gib %s: %v", bad, err)
		}
	}
}
