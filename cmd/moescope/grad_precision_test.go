package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// quantModel is a four-block qwen3_moe whose GEMM dimensions are all
// multiples of 16 (recipes convert only those), initialised at 0.02.
const quantModel = `{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64,
 "head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
 "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 4,
 "mlp_only_layers": [0], "decoder_sparse_step": 1, "norm_topk_prob": true, "vocab_size": 64, "hidden_act": "silu",
 "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "initializer_range": 0.02, "tie_word_embeddings": false,
 "max_position_embeddings": 256, "attention_bias": false, "output_router_logits": false}`

// TestGradPrecisionCompare: grad --precision R --compare bf16 reports the
// deviation from BF16. Comparing bf16 with itself must give exactly none;
// MXFP8 (8-bit elements) moves the gradients, NVFP4 (4-bit) further.
func TestGradPrecisionCompare(t *testing.T) {
	dir := t.TempDir()
	model, tokens := filepath.Join(dir, "config.json"), filepath.Join(dir, "tokens.json")
	os.WriteFile(model, []byte(quantModel), 0o644)
	seqs := make([][]int, 2)
	for i := range seqs {
		for j := range 33 {
			seqs[i] = append(seqs[i], (7*i+13*j)%64)
		}
	}
	b, _ := json.Marshal(seqs)
	os.WriteFile(tokens, b, 0o644)
	dev := map[string]float64{}
	for _, p := range []string{"bf16", "mxfp8", "nvfp4"} {
		var out, errb bytes.Buffer
		if err := run(&out, &errb, []string{"grad", "--model", model, "--init", "1", "--tokens", tokens, "--precision", p, "--compare", "bf16"}); err != nil {
			t.Fatal(p, err, errb.String())
		}
		var rep struct {
			Precision string `json:"precision"`
			Deviation *struct {
				GradRelL2 float64 `json:"grad_rel_l2"`
			} `json:"deviation"`
		}
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.Deviation == nil || rep.Precision != p {
			t.Fatalf("%s: %v, %s", p, err, out.String())
		}
		dev[p] = rep.Deviation.GradRelL2
	}
	t.Logf("gradient relative L2 deviation from bf16: %v", dev)
	if dev["bf16"] != 0 {
		t.Errorf("bf16 against itself: deviation %v, want 0", dev["bf16"])
	}
	if !(dev["mxfp8"] > 0 && dev["nvfp4"] > dev["mxfp8"]) {
		t.Errorf("deviations %v: want 0 < mxfp8 < nvfp4", dev)
	}
	for _, c := range []struct{ args, want string }{
		{"--precision fp8-delayed", "amax history"},
		{"--precision fp9", `--precision = "fp9"`},
		{"--compare int4", `--compare = "int4"`},
		{"--precision mxfp8 --quantize attention", "--quantize"},
		{"--precision fp8-tensorwise --quantize experts", "no tensorwise grouped GEMM"},
	} {
		var out, errb bytes.Buffer
		err := run(&out, &errb, append([]string{"grad", "--model", model, "--init", "1", "--tokens", tokens}, strings.Fields(c.args)...))
		if err == nil || !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
}

// TestTrainPrecision: train --precision runs the ranks' reference under
// the recipe: MXFP8 moves the first step's loss (its forward GEMMs are
// quantised) by well under 1%, NVFP4's stochastic rounding repeats run to
// run, and layouts whose GEMMs run outside the reference's linears are
// refused naming them.
func TestTrainPrecision(t *testing.T) {
	args := []string{"--gpus", "2", "--lbs", "2", "--steps", "2"}
	f32 := trainJSON(t, args...)
	mx := trainJSON(t, append(args, "--precision", "mxfp8")...)
	if d := math.Abs(mx.Losses[0] - f32.Losses[0]); !(d > 0 && d < 0.01*f32.Losses[0]) {
		t.Errorf("first loss mxfp8 %v, float32 %v: want a difference in (0, 1%%)", mx.Losses[0], f32.Losses[0])
	}
	nv1, nv2 := trainJSON(t, append(args, "--precision", "nvfp4")...), trainJSON(t, append(args, "--precision", "nvfp4")...)
	if !slices.Equal(nv1.Losses, nv2.Losses) {
		t.Errorf("nvfp4 losses %v then %v: stochastic rounding is seeded, want equal", nv1.Losses, nv2.Losses)
	}
	var out, errb bytes.Buffer
	err := run(&out, &errb, []string{"train", "--model", "tiny", "--seq", "8", "--gpus", "2", "--ep", "2", "--lbs", "2", "--steps", "1", "--precision", "mxfp8"})
	if err == nil || !strings.Contains(err.Error(), "ep 2") || !strings.Contains(err.Error(), "mxfp8") {
		t.Errorf("mxfp8 under ep 2: %v, want refused naming ep and the recipe", err)
	}
}
