package memory

import (
	"fmt"
	"testing"

	"github.com/moescope/moescope/moe"
)

func estimates(t *testing.T, f func(name string, cfg *moe.Config, l moe.Layout, b Batch, o Options, r Report)) {
	t.Helper()
	policies := []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}, {Mode: moe.ACLayer, Every: 2}}
	for _, cfg := range []*moe.Config{denseCfg(), moeCfg()} {
		for _, l := range []moe.Layout{
			layout(8, 8, 1, moe.ShardFSDP),
			layout(8, 4, 2, moe.ShardFSDP),
			layout(4, 4, 1, moe.ShardZeRO2),
			layout(4, 2, 1, moe.ShardZeRO1),
			layout(2, 2, 1, moe.ShardDDP),
			{GPUs: 4, DPShard: 2, DPReplicate: 2, EP: 1, Sharding: moe.ShardFSDP, KeepGathered: true},
			{GPUs: 4, DPShard: 2, DPReplicate: 2, EP: 1, Sharding: moe.ShardFSDP, AllreduceLastOnly: true},
			{GPUs: 4, DPShard: 4, DPReplicate: 1, EP: 1, Sharding: moe.ShardFSDP},
		} {
			if l.EP > 1 && !cfg.IsMoE() {
				continue
			}
			for _, ac := range policies {
				for _, ga := range []int{1, 3} {
					for _, chunks := range []int{0, 4} {
						b := Batch{LBS: 2, Seq: 16, GradAccum: ga}
						o := Options{AC: ac, LossChunks: chunks}
						r, err := Estimate(cfg, l, b, o)
						name := fmt.Sprintf("%s %+v %s ga%d chunks%d", cfg.Name, l, ac, ga, chunks)
						if err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						f(name, cfg, l, b, o, r)
					}
				}
			}
		}
	}
}

// TestTimelineBalanced: every allocation of a step is freed by its end
// except the persistent state (parameters, optimizer, kept weights), and
// the setup holds exactly StateOf's parameters and optimizer state.
func TestTimelineBalanced(t *testing.T) {
	estimates(t, func(name string, cfg *moe.Config, l moe.Layout, b Batch, o Options, r Report) {
		live := map[Category]int64{}
		for _, e := range r.Events {
			if e.Alloc {
				live[e.Category] += e.Bytes
			} else {
				live[e.Category] -= e.Bytes
			}
		}
		var kept int64
		if l.KeepGathered {
			for _, u := range r.Units {
				kept += 2 * u.Local
			}
		}
		for _, c := range Categories {
			want := map[Category]int64{CatParams: r.State.Params, CatOptimizer: r.State.Optimizer, CatWeights: kept}[c]
			if live[c] != want {
				t.Errorf("%s: %s live at the end = %d, want %d", name, c, live[c], want)
			}
		}
	})
}

// TestPeakIsPrefixMaximum recomputes the peak allocated bytes with a
// plain running sum, independently of Replay's bookkeeping, and checks
// the reserved bytes are at least the allocated ones.
func TestPeakIsPrefixMaximum(t *testing.T) {
	estimates(t, func(name string, cfg *moe.Config, l moe.Layout, b Batch, o Options, r Report) {
		var cur, peak int64
		for _, e := range r.Events {
			n := (e.Bytes + 511) / 512 * 512
			if !e.Alloc {
				n = -n
			}
			cur += n
			peak = max(peak, cur)
		}
		if r.Peak.Allocated != peak {
			t.Errorf("%s: peak %d, running sum says %d", name, r.Peak.Allocated, peak)
		}
		if r.Peak.Reserved < r.Peak.Allocated {
			t.Errorf("%s: reserved %d < allocated %d", name, r.Peak.Reserved, r.Peak.Allocated)
		}
		var live int64
		for _, n := range r.Peak.Live {
			live += n
		}
		if live != r.Peak.Allocated {
			t.Errorf("%s: breakdown sums to %d, peak %d", name, live, r.Peak.Allocated)
		}
	})
}

func TestPeakGrowsWithBatch(t *testing.T) {
	cfg := moeCfg()
	l := layout(8, 8, 2, moe.ShardFSDP)
	prev := int64(0)
	for lbs := 1; lbs <= 16; lbs++ {
		r, err := Estimate(cfg, l, Batch{LBS: lbs, Seq: 32}, Options{AC: moe.AC{Mode: moe.ACSelective}})
		if err != nil {
			t.Fatal(err)
		}
		if r.Peak.Reserved <= prev {
			t.Errorf("lbs %d: reserved %d not above %d", lbs, r.Peak.Reserved, prev)
		}
		prev = r.Peak.Reserved
	}
}

// TestKeepGatheredHoldsAllWeights: with keep-gathered every unit's bf16
// weights (2·Ψ_local) are live during the whole step, so the peak rises by
// at least 2·Ψ_local minus the two units' weights the default holds at its
// peak (current and prefetched).
func TestKeepGatheredHoldsAllWeights(t *testing.T) {
	cfg := denseCfg()
	base := layout(8, 8, 1, moe.ShardFSDP)
	keep := base
	keep.KeepGathered = true
	b := Batch{LBS: 2, Seq: 16}
	r0, err := Estimate(cfg, base, b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r1, err := Estimate(cfg, keep, b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// 2Ψ by unit, each rounded up to 512 B: embedding 2·2048 = 4096,
	// blocks 2·9280 = 18560 → 18944, head 2·2080 = 4160 → 4608.
	if want := int64(4096 + 2*18944 + 4608); r1.Peak.Live[CatWeights] != want {
		t.Errorf("keep-gathered: weights live at peak %d, want 2Ψ rounded = %d", r1.Peak.Live[CatWeights], want)
	}
	if r1.Peak.Allocated <= r0.Peak.Allocated {
		t.Errorf("keep-gathered peak %d not above default %d", r1.Peak.Allocated, r0.Peak.Allocated)
	}
}

func TestReplayRejectsUnbalanced(t *testing.T) {
	a := DefaultAllocator
	for _, ev := range [][]Event{
		{{Label: "x", Alloc: true, Bytes: 10}, {Label: "x", Alloc: true, Bytes: 10}},
		{{Label: "x", Alloc: false, Bytes: 10}},
		{{Label: "x", Alloc: true, Bytes: 10}, {Label: "x", Alloc: false, Bytes: 11}},
		{{Label: "x", Alloc: true, Bytes: -1}},
	} {
		if _, err := Replay(ev, a); err == nil {
			t.Errorf("accepted %v", ev)
		}
	}
}

func TestAllocatorModel(t *testing.T) {
	a := DefaultAllocator
	for _, c := range []struct{ n, block int64 }{
		{0, 0}, {1, 512}, {512, 512}, {513, 1024},
		{1 << 20, 1 << 20}, // ≤ kSmallSize: 512-rounded only
		{1<<20 + 1, 2 << 20}, {3 << 20, 4 << 20}, {4 << 20, 4 << 20},
	} {
		if got := a.Block(c.n); got != c.block {
			t.Errorf("Block(%d) = %d, want %d", c.n, got, c.block)
		}
	}
	// Reserved = (1 + f)·compute peak + comm peak.
	if got := a.Reserved(1000, 300); got != 1000+50+300 {
		t.Errorf("Reserved(1000, 300) = %d, want 1350", got)
	}
	for _, bad := range []Allocator{{RoundBytes: 0, SegmentBytes: 1}, {RoundBytes: 512, SegmentBytes: 256}, {RoundBytes: 1, SegmentBytes: 1, Fragmentation: 1}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestMaxLBS(t *testing.T) {
	cfg := moeCfg()
	l := layout(8, 8, 2, moe.ShardFSDP)
	o := Options{AC: moe.AC{Mode: moe.ACSelective}}
	r4, err := Estimate(cfg, l, Batch{LBS: 37, Seq: 64}, o)
	if err != nil {
		t.Fatal(err)
	}
	device := r4.Peak.Reserved * 2 // lbs 37 fits at a target of 0.5 exactly
	n, r, err := MaxLBS(cfg, l, 64, 1, o, device, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if n != 37 || r.Peak.Reserved != r4.Peak.Reserved {
		t.Errorf("max lbs = %d (reserved %d), want 37 (%d)", n, r.Peak.Reserved, r4.Peak.Reserved)
	}
	if n, _, err := MaxLBS(cfg, l, 64, 1, o, 1000, 0.92); err != nil || n != 0 {
		t.Errorf("1000-byte device: max lbs %d, %v; want 0", n, err)
	}
	if _, _, err := MaxLBS(cfg, l, 64, 1, o, device, 1.5); err == nil {
		t.Error("target 1.5 accepted")
	}
}

func TestEstimateBadInput(t *testing.T) {
	cfg := moeCfg()
	l := layout(8, 8, 1, moe.ShardFSDP)
	for _, b := range []Batch{{LBS: 0, Seq: 16}, {LBS: 1, Seq: 0}, {LBS: 1 << 30, Seq: 1 << 30}, {LBS: 1, Seq: 16, GradAccum: -1}} {
		if _, err := Estimate(cfg, l, b, Options{}); err == nil {
			t.Errorf("batch %+v accepted", b)
		}
	}
	for _, o := range []Options{{Attention: "sparse"}, {LossChunks: -1}, {Master: "f8"}, {Allocator: &Allocator{}}} {
		if _, err := Estimate(cfg, l, Batch{LBS: 1, Seq: 16}, o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
}

// TestPeakByHand derives one step's peaks by hand: one GPU, a vocabulary
// large enough that the loss gradients matter, full checkpointing
// (T = 2·16 = 32 tokens, V = 4096, D = 32, Ψ = 2·4096·32 + 2·9280 + 32 =
// 280,736). Every request is rounded up to 512 B.
//
// In the head's backward, when nll_loss's and log_softmax's fp32 T×V
// gradients are both live:
//
//	parameters 4Ψ                                            1,122,944 → 1,123,328
//	AdamW moments 8Ψ                                         2,245,888 → 2,246,144
//	gathered bf16 weights, last block 2·9280                    18,560 →    18,944
//	gathered bf16 weights, head 2·(32 + 131,072)               262,208 →   262,656
//	saved: token ids 8T                                             256 →       512
//	saved: two blocks' inputs 2·(2TD)                          2·2,048 →     4,096
//	saved: final-norm input 2TD, rstd 4T, LM-head input 2TD      4,224 →     4,608
//	saved: log-probabilities 4TV and labels 8T                 524,544 →   524,800
//	gradient of the log-probabilities 4TV                      524,288 →   524,288
//	gradient of the fp32 logits 4TV                            524,288 →   524,288
//	                                                                      5,233,664
//
// In the optimizer step: parameters 1,123,328 + moments 2,246,144 +
// gradients 4Ψ by unit (embedding 524,288, blocks 2·37,376, head
// 4·131,104 = 524,416 → 524,800; 1,123,840) + the foreach temporary
// sqrt(v) 4Ψ → 1,123,328 = 5,616,640, the step's peak.
func TestPeakByHand(t *testing.T) {
	cfg := denseCfg()
	cfg.Vocab = 4096
	r, err := Estimate(cfg, moe.DefaultLayout(), Batch{LBS: 2, Seq: 16}, Options{AC: moe.AC{Mode: moe.ACFull}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Peak.Allocated != 5616640 || r.Events[r.Peak.Index].Phase != Optimizer {
		t.Errorf("peak allocated %d at %s; by hand 5616640 in the optimizer step", r.Peak.Allocated, r.Events[r.Peak.Index])
	}
	var cur int64
	for _, e := range r.Events {
		n := (e.Bytes + 511) / 512 * 512
		if !e.Alloc {
			n = -n
		}
		cur += n
		if e.Label == "grad_logits_f32" && e.Alloc {
			if cur != 5233664 {
				t.Errorf("live at the head's fp32 logit gradient: %d, by hand 5233664", cur)
			}
			return
		}
	}
	t.Error("no grad_logits_f32 event")
}
