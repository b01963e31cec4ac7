package memory

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// perToken is the saved bytes of layer per token under sh (T = sh.Batch·sh.Seq).
func perToken(t *testing.T, cfg *moe.Config, layer int, sh Shape) int64 {
	t.Helper()
	rs, err := Saved(cfg, layer, sh)
	if err != nil {
		t.Fatal(err)
	}
	T := int64(sh.Batch * sh.Seq)
	b := SavedBytes(rs)
	if b%T != 0 {
		t.Fatalf("saved %d bytes is not a whole number per token over %d tokens", b, T)
	}
	return b / T
}

// TestTEDenseBlock derives denseCfg's block (D 32, H 4 × d 8, G 2, F 64,
// bf16 activations, ac none, flash attention) by hand, per token:
// torchtitan's eager block keeps the attention norm's input 64 B and rstd
// 4, q_proj's input 64, q 64, k 32, v 32, the attention output 64 and its
// log-sum-exp 4 × 4 = 16, the FFN norm's input 64 and rstd 4, the MLP's
// input 64, gate, silu(gate) and up 128 each and the down projection's
// input 128: 984 bytes. Megatron-Core's TE block drops silu(gate) (fused
// SwiGLU): 856. Under an fp8 recipe converting the linear set, the
// quantized inputs of q_proj (32), the MLP (32) and the down projection
// (64) replace their bf16 ones and o_proj keeps a quantized copy of the
// attention output (32): 856 − 32 − 32 − 64 + 32 = 760; MXFP8 adds one
// scale byte per 32 elements: 1 + 1 + 2 + 1 = 765. NVFP4 stores those
// four inputs as packed e2m1 pairs with an e4m3 scale per 16 elements:
// (32 + 32 + 64 + 32)/2 + (2 + 2 + 4 + 2) = 90 bytes for the fp8 case's
// 160: 760 − 160 + 90 = 690.
func TestTEDenseBlock(t *testing.T) {
	cfg := denseCfg()
	sh := Shape{Batch: 2, Seq: 8, AC: moe.AC{Mode: moe.ACNone}, Act: moe.BF16}
	cases := []struct {
		name string
		te   TE
		want int64
	}{
		{"torch", TE{}, 984},
		{"te bf16", TE{Blocks: true}, 856},
		{"te fp8", TE{Blocks: true, Linear: true, Experts: true}, 760},
		{"te mxfp8", TE{Blocks: true, Linear: true, Experts: true, MX: true}, 765},
		{"te nvfp4", TE{Blocks: true, Linear: true, Experts: true, FP4: true}, 690},
		{"te blockwise", TE{Blocks: true, Linear: true, Experts: true, Block: true}, 765},
	}
	for _, c := range cases {
		sh.TE = c.te
		if got := perToken(t, cfg, 0, sh); got != c.want {
			t.Errorf("%s: %d bytes per token, want %d by hand", c.name, got, c.want)
		}
	}
	// A fully checkpointed block keeps its input alone either way.
	sh.AC = moe.AC{Mode: moe.ACFull}
	full := perToken(t, cfg, 0, Shape{Batch: 2, Seq: 8, AC: sh.AC, Act: moe.BF16})
	if got := perToken(t, cfg, 0, sh); got != full {
		t.Errorf("full: %d bytes per token, want the torch block's %d", got, full)
	}
}

// TestTEMoEBlock checks the MoE block (moeCfg: D 32, K 2 of E 8 experts of
// F 16) against torchtitan's eager table by the differences the TE
// experts make, per token: the routed SwiGLU's silu(gate) (K·F bf16 = 64
// B) and the combine's expert output rows (K·D bf16 = 128 B) are not kept
// (the routing weights, K f32, are, by the weighted SwiGLU instead of the
// combine): −192. Quantizing the experts set only (fp8), the permuted
// tokens K·D = 64 elements and the down projection's input K·F = 32 take
// one byte instead of two: a further −96.
func TestTEMoEBlock(t *testing.T) {
	cfg := moeCfg()
	sh := Shape{Batch: 2, Seq: 8, AC: moe.AC{Mode: moe.ACNone}, Act: moe.BF16}
	eager := perToken(t, cfg, 0, sh)
	sh.TE = TE{Blocks: true}
	if got := perToken(t, cfg, 0, sh); got != eager-192 {
		t.Errorf("te bf16: %d bytes per token, want eager %d − 192 = %d", got, eager, eager-192)
	}
	sh.TE = TE{Blocks: true, Experts: true}
	if got := perToken(t, cfg, 0, sh); got != eager-192-96 {
		t.Errorf("te fp8 experts: %d bytes per token, want eager %d − 288 = %d", got, eager, eager-288)
	}
	rs, err := Saved(cfg, 0, sh)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Op == moe.OpCombine {
			t.Errorf("combine keeps %v under TE", r)
		}
	}
}

// TestTELoss: TE's cross-entropy keeps the bf16 logits, T·V·2 bytes, in
// place of the eager loss's fp32 log-probabilities (T·V·4), and its
// backward allocates no gradient of the logits.
func TestTELoss(t *testing.T) {
	cfg := denseCfg()
	sh := Shape{Batch: 2, Seq: 8, AC: moe.AC{Mode: moe.ACNone}, Act: moe.BF16}
	head := cfg.LayerHead()
	eager := perToken(t, cfg, head, sh)
	sh.TE = TE{Loss: true}
	V := int64(cfg.Vocab)
	if got := perToken(t, cfg, head, sh); got != eager-4*V+2*V {
		t.Errorf("te loss head: %d bytes per token, want %d − 4V + 2V = %d", got, eager, eager-2*V)
	}
	r := job.EagerRecipe()
	r.LossImpl = job.TELoss
	if err := r.Resolve(); err != nil {
		t.Fatal(err)
	}
	rep, err := Estimate(cfg, layout(1, 1, 1, job.ShardFSDP), Batch{LBS: 2, Seq: 8}, OptionsOf(r, moe.AC{Mode: moe.ACNone}))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range rep.Events {
		if strings.HasPrefix(e.Label, "grad_logits") || e.Category == CatLoss {
			t.Fatalf("TE loss emits %+v", e)
		}
	}
}

// TestTERefusals: TE blocks are not compiled nor under torchtitan's
// per-op selective policy; TE's loss is neither compiled nor chunked.
func TestTERefusals(t *testing.T) {
	cfg := denseCfg()
	for _, o := range []Options{
		{TE: TE{Blocks: true}, AC: moe.AC{Mode: moe.ACSelective}},
		{TE: TE{Blocks: true}, Compile: Compile{Model: true}},
		{TE: TE{Loss: true}, Compile: Compile{Loss: true}},
		{TE: TE{Loss: true}, LossChunks: 4},
	} {
		if _, err := Estimate(cfg, layout(1, 1, 1, job.ShardFSDP), Batch{LBS: 1, Seq: 8}, o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

// TestTEOptionsOf: the run description's transformer_impl and loss_impl,
// with the recipe's converted sets, give the memory model's TE.
func TestTEOptionsOf(t *testing.T) {
	r := job.EagerRecipe()
	r.Precision, r.TransformerImpl, r.LossImpl = job.MXFP8, job.TETransformer, job.TELoss
	if err := r.Resolve(); err != nil {
		t.Fatal(err)
	}
	want := TE{Blocks: true, Loss: true, Linear: true, Experts: true, MX: true}
	if got := OptionsOf(r, moe.AC{}).TE; got != want {
		t.Errorf("mxfp8: TE %+v, want %+v", got, want)
	}
	r.Precision = job.BF16
	if got := OptionsOf(r, moe.AC{}).TE; got != (TE{Blocks: true, Loss: true}) {
		t.Errorf("bf16: TE %+v, want blocks and loss only", got)
	}
	r.TransformerImpl = "megatron_local"
	if err := r.Validate(); err == nil {
		t.Error("transformer_impl megatron_local accepted")
	}
}
