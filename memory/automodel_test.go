package memory

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
)

// automodelOn is AutoModel's benchmark setting: DeepEP experts and
// FakeBalancedGate.
var automodelOn = AutoModel{On: true, Experts: true, FakeGate: true}

// TestAutoModelGPTOSSBlock derives a GPT-OSS-120B block (D 2880, H 64 × d
// 64, G 8, E 128 experts of F 2880, top-4, attention sinks; bf16, ac none)
// under AutoModel's modules by hand, per token, from the modules' code at
// Automodel 2c236e081: the attention norm's input 5760 B and rstd 4;
// q/k/v's input 5760; flex attention's q 8192, k 1024, v 1024, output 8192
// and log-sum-exp 64 × 4 = 256; the sinks' scale 256 and the rescaled
// output o_proj saves 8192; the FFN norm's input 5760 and rstd 4; the
// dispatch's order 4 × 8 = 32; per top-k slot the permuted row 5760, the
// fused activation's input (gate and up, 2 × 5760) and the down
// projection's input 5760, so 4 × 23040 = 92160; the weights 4 × 4 = 16.
// FakeBalancedGate keeps nothing of a router. 136,632 bytes.
func TestAutoModelGPTOSSBlock(t *testing.T) {
	cfg, err := hf.Load("gpt-oss-120b")
	if err != nil {
		t.Fatal(err)
	}
	sh := Shape{Batch: 2, Seq: 4096, AC: moe.AC{Mode: moe.ACNone}, EP: 64, Act: moe.BF16, AutoModel: automodelOn}
	for _, layer := range []int{0, 1} { // sliding-window and full attention
		if got := perToken(t, cfg, layer, sh); got != 136632 {
			t.Errorf("layer %d: %d bytes per token, want 136632", layer, got)
		}
	}
	// A real router (learned routing) keeps what the eager table's does.
	gate := sh
	gate.AutoModel.FakeGate = false
	eager := sh
	eager.AutoModel = AutoModel{}
	if got, want := routerBytes(t, cfg, gate), routerBytes(t, cfg, eager); got != want || got == 0 {
		t.Errorf("real gate: router records %d bytes, want the eager table's %d", got, want)
	}
	// A fully checkpointed block keeps its input alone either way.
	full := sh
	full.AC = moe.AC{Mode: moe.ACFull}
	eager.AC = full.AC
	if got, want := perToken(t, cfg, 0, full), perToken(t, cfg, 0, eager); got != want {
		t.Errorf("ac full: %d bytes per token, want the eager table's %d", got, want)
	}
}

func routerBytes(t *testing.T, cfg *moe.Config, sh Shape) int64 {
	t.Helper()
	rs, err := Saved(cfg, 0, sh)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, r := range rs {
		if r.Op == moe.OpRouter || r.Op == moe.OpRouterTopK {
			n += r.Bytes()
		}
	}
	return n
}

// TestAutoModelHoldsLogits: AutoModel's trainer keeps the logits (T·V bf16,
// 16 tokens × 64 = 2048 bytes on denseCfg) from the LM head's forward to
// the end of the micro-step's backward, where torchtitan frees them after
// the loss's forward; everything else of a dense block is the eager
// table's, so the bytes live when the loss's gradient is allocated differ
// by exactly the logits.
func TestAutoModelHoldsLogits(t *testing.T) {
	cfg := denseCfg()
	r := job.EagerRecipe()
	r.LossDType = moe.BF16
	if err := r.Resolve(); err != nil {
		t.Fatal(err)
	}
	o := OptionsOf(r, moe.AC{Mode: moe.ACNone})
	liveAtGrad := func(o Options) (live int64, lastFree string) {
		rep, err := Estimate(cfg, layout(1, 1, 1, job.ShardFSDP), Batch{LBS: 2, Seq: 8}, o)
		if err != nil {
			t.Fatal(err)
		}
		var cur int64
		for _, e := range rep.Events {
			cur += e.Delta()
			if e.Alloc && e.Label == "grad_logits" {
				live = cur
			}
			if e.Phase == Backward && !e.Alloc && e.Category == CatLoss {
				lastFree = e.Label
			}
		}
		return live, lastFree
	}
	eager, _ := liveAtGrad(o)
	o.AutoModel = AutoModel{On: true}
	held, last := liveAtGrad(o)
	if held-eager != 2*16*64 {
		t.Errorf("live at grad_logits: %d bytes held, %d eager: differ by %d, want 2048", held, eager, held-eager)
	}
	if last != "logits" {
		t.Errorf("last loss free of backward is %q, want the held logits", last)
	}
}

// TestAutoModelRefusals: what AutoModel's modules are not modelled with.
func TestAutoModelRefusals(t *testing.T) {
	cfg := moeCfg()
	am := automodelOn
	for _, c := range []struct {
		name string
		l    job.Layout
		o    Options
	}{
		{"all-gather experts", layout(2, 2, 2, job.ShardFSDP), Options{AutoModel: AutoModel{On: true}, AC: moe.AC{Mode: moe.ACNone}}},
		{"selective", layout(1, 1, 1, job.ShardFSDP), Options{AutoModel: am, AC: moe.AC{Mode: moe.ACSelective}}},
		{"compiled", layout(1, 1, 1, job.ShardFSDP), Options{AutoModel: am, AC: moe.AC{Mode: moe.ACNone}, Compile: Compile{Model: true}}},
		{"chunked loss", layout(1, 1, 1, job.ShardFSDP), Options{AutoModel: am, AC: moe.AC{Mode: moe.ACNone}, LossChunks: 4}},
	} {
		if _, err := Estimate(cfg, c.l, Batch{LBS: 1, Seq: 8}, c.o); err == nil {
			t.Errorf("%s accepted", c.name)
		}
	}
	l := layout(2, 2, 1, job.ShardFSDP)
	l.PP, l.PPSchedule = 2, "1F1B"
	if _, err := Estimate(cfg, l, Batch{LBS: 2, Seq: 8}, Options{AutoModel: am, AC: moe.AC{Mode: moe.ACNone}}); err == nil {
		t.Error("pp 2 accepted")
	}
}

// TestAutoModelOptionsOf: transformer_impl automodel gives DeepEP experts
// under a row-per-rank dispatcher and the fake gate under balanced routing;
// the recipe refuses low precision, and the memory model compile and
// chunked or TE losses.
func TestAutoModelOptionsOf(t *testing.T) {
	r := job.EagerRecipe()
	r.TransformerImpl, r.Dispatcher = job.AutoModelTransformer, job.DeepEP
	if err := r.Resolve(); err != nil {
		t.Fatal(err)
	}
	if got := OptionsOf(r, moe.AC{}).AutoModel; got != automodelOn {
		t.Errorf("deepep, balanced: %+v, want %+v", got, automodelOn)
	}
	r.Routing, r.Dispatcher = job.RoutingLearned, job.AllToAll
	if got := OptionsOf(r, moe.AC{}).AutoModel; got != (AutoModel{On: true}) {
		t.Errorf("all_to_all, learned: %+v, want on alone", got)
	}
	fp8 := job.EagerRecipe()
	fp8.TransformerImpl, fp8.Precision = job.AutoModelTransformer, job.MXFP8
	if err := fp8.Resolve(); err == nil {
		t.Error("fp8 accepted")
	}
	for name, bad := range map[string]func(*job.Recipe){
		"compile": func(r *job.Recipe) { r.Compile = true },
		"chunks":  func(r *job.Recipe) { r.LossChunks = 8 },
		"te loss": func(r *job.Recipe) { r.LossImpl = job.TELoss },
	} {
		b := job.EagerRecipe()
		b.TransformerImpl, b.Dispatcher = job.AutoModelTransformer, job.DeepEP
		bad(&b)
		if err := b.Resolve(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := CheckOptions(layout(1, 1, 1, job.ShardFSDP), OptionsOf(b, moe.AC{Mode: moe.ACNone})); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}
