package memory

import (
	"sort"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
)

// recordNames lists records as "op tensor", sorted.
func recordNames(rs []moe.SavedRecord) []string {
	var out []string
	for _, r := range rs {
		out = append(out, string(r.Op)+" "+string(r.Tensor))
	}
	sort.Strings(out)
	return out
}

// TestCompiledBlockDrops: what a compiled block no longer saves, per block
// kind and policy. The expected lists are written by hand from torchtitan's
// apply_compile (a dense block is one graph; a MoE block's norms, attention,
// router and shared experts are graphs of their own, its routed experts
// eager) and from what each fused chain needs in backward: SwiGLU needs
// only gate and up, an RMSNorm output is rebuilt from its input and rstd,
// QK-norm + RoPE rebuild q and k from the norms' inputs, and a selective
// policy over one graph drops the down projection's output, which no
// backward op reads.
func TestCompiledBlockDrops(t *testing.T) {
	cases := []struct {
		model string
		ac    moe.AC
		want  []string
	}{
		{"llama3-8b", moe.AC{Mode: moe.ACNone}, []string{"mlp_act silu_gate", "mlp_down_proj input", "mlp_gate_proj input", "q_proj input"}},
		{"llama3-8b", moe.AC{Mode: moe.ACSelective}, []string{"mlp_down_proj output"}},
		{"llama3-8b", moe.AC{Mode: moe.ACFull}, nil},
		// Qwen3-MoE: QK-norm, no shared experts, eager routed experts.
		{"qwen3-30b-a3b", moe.AC{Mode: moe.ACNone}, []string{"attention k", "attention q"}},
		{"qwen3-30b-a3b", moe.AC{Mode: moe.ACSelective}, nil},
		// DeepSeek-MoE: shared experts (a compiled submodule), no QK-norm;
		// layer 1 is its first MoE block.
		{"deepseek-moe-16b", moe.AC{Mode: moe.ACNone}, []string{"shared_act silu_gate", "shared_down_proj input"}},
	}
	for _, c := range cases {
		cfg, err := hf.Load(c.model)
		if err != nil {
			t.Fatal(err)
		}
		layer := 0
		for !cfg.MoELayer[layer] && c.model != "llama3-8b" {
			layer++
		}
		sh := Shape{Batch: 2, Seq: 64, AC: c.ac}
		eager, err := Saved(cfg, layer, sh)
		if err != nil {
			t.Fatal(err)
		}
		sh.Compile = Compiled
		compiled, err := Saved(cfg, layer, sh)
		if err != nil {
			t.Fatal(err)
		}
		have := map[string]bool{}
		for _, n := range recordNames(compiled) {
			have[n] = true
		}
		var dropped []string
		for _, n := range recordNames(eager) {
			if !have[n] {
				dropped = append(dropped, n)
			}
		}
		if strings.Join(dropped, ", ") != strings.Join(c.want, ", ") {
			t.Errorf("%s layer %d %s: compiled drops [%s], want [%s]", c.model, layer, c.ac, strings.Join(dropped, ", "), strings.Join(c.want, ", "))
		}
		if len(compiled)+len(dropped) != len(eager) {
			t.Errorf("%s %s: compiled adds records: %v", c.model, c.ac, recordNames(compiled))
		}
	}
}

// lossPeakPerLogit is the most bytes the loss's vocabulary-sized tensors
// hold at once over a step's events, divided by tokens × vocabulary.
func lossPeakPerLogit(t *testing.T, cfg *moe.Config, o Options, tokens int) int64 {
	t.Helper()
	r, err := Estimate(cfg, job.Layout{GPUs: 1, DPShard: 1, DPReplicate: 1, EP: 1, Sharding: job.ShardFSDP, ReshardAfterForward: true},
		Batch{LBS: 1, Seq: tokens}, o)
	if err != nil {
		t.Fatal(err)
	}
	n := int64(tokens) * int64(cfg.Vocab)
	var live, peak int64
	for _, e := range r.Events {
		vocab := e.Category == CatLoss || e.Label == "saved loss log_probs" || e.Label == "saved loss logits"
		if !vocab {
			continue
		}
		live += e.Delta()
		peak = max(peak, live)
	}
	if peak%n != 0 {
		t.Fatalf("peak %d B is not a whole number of bytes per logit (%d logits)", peak, n)
	}
	return peak / n
}

// TestLossBytesPerLogit: the loss's peak, in bytes per logit, by hand.
// Eager with torchtitan's upcast, backward holds the fp32 log-probabilities,
// nll_loss's fp32 gradient and log_softmax's fp32 input gradient: 12.
// Eager on bf16 logits, the same three in bf16: 6. Compiled, the saved bf16
// logits and the bf16 gradient the fused backward writes: 4.
func TestLossBytesPerLogit(t *testing.T) {
	cfg, err := hf.Load("tiny")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		o    Options
		want int64
	}{
		{"eager f32", Options{}, 12},
		{"eager bf16", Options{LossDType: moe.BF16}, 6},
		{"compiled", Options{Compile: Compiled}, 4},
		{"compiled, bf16 loss type", Options{Compile: Compiled, LossDType: moe.BF16}, 4},
		{"model compiled, loss eager", Options{Compile: Compile{Model: true}}, 12},
	} {
		if got := lossPeakPerLogit(t, cfg, c.o, 64); got != c.want {
			t.Errorf("%s: %d bytes per logit at the loss's peak, want %d", c.name, got, c.want)
		}
	}
}

// TestExpandableSegments replays two small timelines through both segment
// modes; reserved bytes by hand (large pool: 20 MiB pages when expandable).
func TestExpandableSegments(t *testing.T) {
	const MiB = 1 << 20
	a := DefaultAllocator
	ev := func(label string, alloc bool, n int64) Event {
		return Event{Phase: Forward, Label: label, Alloc: alloc, Bytes: n, Stream: ComputeStream, Category: CatWorkspace}
	}
	cases := []struct {
		name              string
		events            []Event
		fixed, expandable int64
	}{
		// Fixed: x's 30 MiB segment cannot hold z (50): 80 MiB. Expandable:
		// x maps 40 MiB (two pages); freed, the free end grows by one page
		// for z: 60 MiB, and the second step fits in it.
		{"a freed end grows", []Event{ev("x", true, 30*MiB), ev("x", false, 30*MiB), ev("z", true, 50*MiB), ev("z", false, 50*MiB)},
			80 * MiB, 60 * MiB},
		// y holds the end when z (40) comes: a new mapping either way;
		// Fixed 30+30+40, expandable 40+20+40 (x's remainder serves y's
		// start). The second step reuses the freed 100 MiB.
		{"a busy end", []Event{ev("x", true, 30*MiB), ev("y", true, 30*MiB), ev("x", false, 30*MiB), ev("z", true, 40*MiB),
			ev("y", false, 30*MiB), ev("z", false, 40*MiB)}, 100 * MiB, 100 * MiB},
	}
	for _, c := range cases {
		if got := a.Simulate(c.events, Fixed)[ComputeStream]; got != c.fixed {
			t.Errorf("%s, fixed: reserved %d MiB, want %d", c.name, got/MiB, c.fixed/MiB)
		}
		if got := a.Simulate(c.events, Expandable)[ComputeStream]; got != c.expandable {
			t.Errorf("%s, expandable: reserved %d MiB, want %d", c.name, got/MiB, c.expandable/MiB)
		}
	}
	if _, err := Replay(cases[0].events, a, "grow"); err == nil || !strings.Contains(err.Error(), "segments") {
		t.Errorf("segment mode %q: err = %v, want one naming segments", "grow", err)
	}
}

// TestCompileLowersPeak: on a dense, a QK-norm MoE and a shared-expert MoE
// model, under each policy, compiling never raises the peak allocated
// (it only removes saved tensors and vocabulary-sized copies).
func TestCompileLowersPeak(t *testing.T) {
	for _, name := range []string{"llama3-8b", "qwen3-30b-a3b", "deepseek-moe-16b"} {
		cfg, err := hf.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		l := job.Layout{GPUs: 8, DPShard: 8, DPReplicate: 1, EP: 1, Sharding: job.ShardFSDP, ReshardAfterForward: true}
		for _, ac := range []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}} {
			est := func(o Options) Peak {
				o.AC = ac
				r, err := Estimate(cfg, l, Batch{LBS: 1, Seq: 2048}, o)
				if err != nil {
					t.Fatal(err)
				}
				return r.Peak
			}
			eager, compiled := est(Options{}), est(Options{Compile: Compiled})
			if compiled.Allocated > eager.Allocated {
				t.Errorf("%s %s: compiled peak allocated %d > eager %d", name, ac, compiled.Allocated, eager.Allocated)
			}
		}
	}
}
