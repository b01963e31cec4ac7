package memory

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

func estimates(t *testing.T, f func(name string, cfg *moe.Config, l job.Layout, b Batch, o Options, r Report)) {
	t.Helper()
	policies := []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}, {Mode: moe.ACLayer, Every: 2}}
	for _, cfg := range []*moe.Config{denseCfg(), moeCfg()} {
		for _, l := range []job.Layout{
			layout(8, 8, 1, job.ShardFSDP),
			layout(8, 4, 2, job.ShardFSDP),
			layout(4, 4, 1, job.ShardZeRO2),
			layout(4, 2, 1, job.ShardZeRO1),
			layout(2, 2, 1, job.ShardDDP),
			{GPUs: 4, DPShard: 2, DPReplicate: 2, EP: 1, Sharding: job.ShardFSDP, KeepGathered: true},
			{GPUs: 4, DPShard: 2, DPReplicate: 2, EP: 1, Sharding: job.ShardFSDP, AllreduceLastOnly: true},
			{GPUs: 4, DPShard: 4, DPReplicate: 1, EP: 1, Sharding: job.ShardFSDP},
			{GPUs: 4, DPShard: 2, DPReplicate: 2, EP: 1, Sharding: job.ShardFSDP, ReshardAfterForward: true, GradSyncLastOnly: true},
			{GPUs: 2, DPShard: 2, DPReplicate: 1, EP: 1, Sharding: job.ShardFSDP, KeepGathered: true, AllreduceLastOnly: true, GradSyncLastOnly: true},
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
// except the persistent state (parameters, optimizer), and the setup holds
// exactly StateOf's parameters and optimizer state. Keep-gathered keeps
// weights from one micro-step's backward to the next one's forward only
// (DESIGN's layout contract): the last backward frees them too.
func TestTimelineBalanced(t *testing.T) {
	estimates(t, func(name string, cfg *moe.Config, l job.Layout, b Batch, o Options, r Report) {
		live := map[Category]int64{}
		for _, e := range r.Events {
			live[e.Category] += e.Delta()
		}
		for _, c := range Categories() {
			want := map[Category]int64{CatParams: r.State.Params, CatOptimizer: r.State.Optimizer}[c]
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
	estimates(t, func(name string, cfg *moe.Config, l job.Layout, b Batch, o Options, r Report) {
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
	l := layout(8, 8, 2, job.ShardFSDP)
	var prevA, prevR int64
	for lbs := 1; lbs <= 16; lbs++ {
		r, err := Estimate(cfg, l, Batch{LBS: lbs, Seq: 32}, Options{AC: moe.AC{Mode: moe.ACSelective}})
		if err != nil {
			t.Fatal(err)
		}
		// Allocated grows with every sequence; reserved comes in
		// segments, so it may stay put, but never shrinks.
		if r.Peak.Allocated <= prevA || r.Peak.Reserved < prevR {
			t.Errorf("lbs %d: allocated %d (before %d), reserved %d (before %d)", lbs, r.Peak.Allocated, prevA, r.Peak.Reserved, prevR)
		}
		prevA, prevR = r.Peak.Allocated, r.Peak.Reserved
	}
}

// TestKeepGatheredKeepsWeightsAcrossMicroSteps: keep-gathered keeps a
// unit's gathered weights from one micro-step's backward to the next one's
// forward (DESIGN's layout contract, FSDP2's reshard_after_backward off
// but in the last micro-step). With two micro-steps and no reshard after
// forward, counted by hand from that definition: micro-step 0's forward
// allocates every unit's weights (embedding, two blocks, head: 4), its
// backward frees none, micro-step 1's forward allocates none, its backward
// frees all 4. Without keep-gathered each backward frees all 4 and the
// second forward allocates them again.
func TestKeepGatheredKeepsWeightsAcrossMicroSteps(t *testing.T) {
	cfg := denseCfg()
	for _, keep := range []bool{true, false} {
		l := layout(8, 8, 1, job.ShardFSDP)
		l.ReshardAfterForward, l.KeepGathered = false, keep
		r, err := Estimate(cfg, l, Batch{LBS: 2, Seq: 16, GradAccum: 2}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		// Weight events per pass, in order: forward 0, backward 0,
		// forward 1, backward 1 (allocs, frees).
		var got [][2]int
		var last Phase = Setup
		for _, e := range r.Events {
			if e.Phase != last && (e.Phase == Forward || e.Phase == Backward) {
				got = append(got, [2]int{})
			}
			last = e.Phase
			if e.Category == CatWeights && len(got) > 0 {
				if e.Alloc {
					got[len(got)-1][0]++
				} else {
					got[len(got)-1][1]++
				}
			}
		}
		want := [][2]int{{4, 0}, {0, 0}, {0, 0}, {0, 4}}
		if !keep {
			want = [][2]int{{4, 0}, {0, 4}, {4, 0}, {0, 4}}
		}
		if !slices.Equal(got, want) {
			t.Errorf("keep-gathered %v: weight (allocs, frees) per pass %v, want %v", keep, got, want)
		}
	}
}

func TestReplayRejectsUnbalanced(t *testing.T) {
	a := DefaultAllocator
	for _, ev := range [][]Event{
		{{Label: "x", Alloc: true, Bytes: 10, Stream: ComputeStream}, {Label: "x", Alloc: true, Bytes: 10, Stream: ComputeStream}},
		{{Label: "x", Alloc: false, Bytes: 10, Stream: ComputeStream}},
		{{Label: "x", Alloc: true, Bytes: 10, Stream: ComputeStream}, {Label: "x", Alloc: false, Bytes: 11, Stream: ComputeStream}},
		{{Label: "x", Alloc: true, Bytes: -1}},
		{{Label: "x", Alloc: true, Bytes: 1, Stream: "nccl"}},
	} {
		if _, err := Replay(ev, a, Fixed); err == nil {
			t.Errorf("accepted %v", ev)
		}
	}
}

func TestAllocatorModel(t *testing.T) {
	a := DefaultAllocator
	const MiB = 1 << 20
	for _, c := range []struct{ n, round, seg int64 }{
		{1, 512, 2 * MiB}, {512, 512, 2 * MiB}, {513, 1024, 2 * MiB},
		{MiB, MiB, 2 * MiB},                  // ≤ kSmallSize: small pool, 2 MiB segment
		{MiB + 1, MiB + 512, 20 * MiB},       // large, < kMinLargeAlloc: a 20 MiB segment
		{10 * MiB, 10 * MiB, 10 * MiB},       // ≥ kMinLargeAlloc: its own segment
		{15*MiB + 3, 15*MiB + 512, 16 * MiB}, // rounded to 2 MiB
	} {
		if a.Round(c.n) != c.round || a.SegmentSize(a.Round(c.n)) != c.seg {
			t.Errorf("request %d: block %d segment %d, want %d %d", c.n, a.Round(c.n), a.SegmentSize(a.Round(c.n)), c.round, c.seg)
		}
	}
	ev := func(label string, alloc bool, n int64, st Stream) Event {
		return Event{Phase: Forward, Label: label, Alloc: alloc, Bytes: n, Stream: st, Category: CatWorkspace}
	}
	// By hand, first step: x (15 MiB) reserves a 16 MiB segment, whole
	// (the 1 MiB rest is not > kSmallSize); after x is freed, y (5 MiB)
	// splits it (rest 11 MiB); z (12 MiB) fits no free block: a second
	// segment of 12 MiB. Second step: x takes the 16 MiB block, y the
	// 12 MiB one (best fit), z the 16 MiB one again: nothing new. 28 MiB.
	events := []Event{
		ev("x", true, 15*MiB, ComputeStream), ev("x", false, 15*MiB, ComputeStream),
		ev("y", true, 5*MiB, ComputeStream), ev("z", true, 12*MiB, ComputeStream),
		ev("y", false, 5*MiB, ComputeStream), ev("z", false, 12*MiB, ComputeStream),
		// A block cached by the reduce-scatter stream does not serve the
		// compute stream: 100 MiB twice.
		ev("g", true, 100*MiB, ReduceScatterStream), ev("g", false, 100*MiB, ReduceScatterStream),
		ev("h", true, 100*MiB, ComputeStream), ev("h", false, 100*MiB, ComputeStream),
		// Small requests share a 2 MiB small-pool segment.
		ev("s1", true, 1000, ComputeStream), ev("s2", true, 3000, ComputeStream),
		ev("s1", false, 1000, ComputeStream), ev("s2", false, 3000, ComputeStream),
	}
	got := a.Simulate(events, Fixed)
	if got[ComputeStream] != 28*MiB+100*MiB+2*MiB || got[ReduceScatterStream] != 100*MiB {
		t.Errorf("reserved by stream %v, by hand compute %d, reduce_scatter %d", got, 130*MiB, 100*MiB)
	}
	p, err := Replay(events, a, Fixed)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(230*MiB) + int64(a.Fragmentation*float64(230*MiB)); p.Reserved != want {
		t.Errorf("reserved %d, want 230 MiB + 2%% = %d", p.Reserved, want)
	}
	for _, bad := range []Allocator{{RoundBytes: 0}, func() Allocator { b := a; b.SmallSegmentBytes = 1; return b }(),
		func() Allocator { b := a; b.Fragmentation = 1; return b }()} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestMaxLBS(t *testing.T) {
	cfg := moeCfg()
	l := layout(8, 8, 2, job.ShardFSDP)
	o := Options{AC: moe.AC{Mode: moe.ACSelective}}
	r37, err := Estimate(cfg, l, Batch{LBS: 37, Seq: 64}, o)
	if err != nil {
		t.Fatal(err)
	}
	device := r37.Peak.Reserved * 2 // lbs 37 fits at a target of 0.5 exactly
	n, r, err := MaxLBS(cfg, l, 64, 1, o, device, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	next, err := Estimate(cfg, l, Batch{LBS: n + 1, Seq: 64}, o)
	if err != nil {
		t.Fatal(err)
	}
	if n < 37 || r.Peak.Reserved > device/2 || next.Peak.Reserved <= device/2 {
		t.Errorf("max lbs = %d (reserved %d, next %d), limit %d; lbs 37 fits", n, r.Peak.Reserved, next.Peak.Reserved, device/2)
	}
	if n, _, err := MaxLBS(cfg, l, 64, 1, o, 1000, 0.92); err != nil || n != 0 {
		t.Errorf("1000-byte device: max lbs %d, %v; want 0", n, err)
	}
	if _, _, err := MaxLBS(cfg, l, 64, 1, o, device, 1.5); err == nil {
		t.Error("target 1.5 accepted")
	}
}

// TestMaxLBSLinearScan compares the guided search with the plainest
// oracle: lbs 1, 2, 3, … until the first that does not fit. Device sizes
// put the boundary exactly on, and one byte either side of, several lbs.
func TestMaxLBSLinearScan(t *testing.T) {
	cfg := moeCfg()
	l := layout(8, 8, 2, job.ShardFSDP)
	o := Options{AC: moe.AC{Mode: moe.ACFull}}
	reserved := func(lbs int) int64 {
		r, err := Estimate(cfg, l, Batch{LBS: lbs, Seq: 32}, o)
		if err != nil {
			t.Fatal(err)
		}
		return r.Peak.Reserved
	}
	for _, k := range []int{1, 2, 3, 5, 17, 40} {
		for _, delta := range []int64{-1, 0, 1} {
			device := reserved(k) + delta // target 1: the limit is the device
			want := 0
			for want < 200 && reserved(want+1) <= device {
				want++
			}
			got, r, err := MaxLBS(cfg, l, 32, 1, o, device, 1)
			if err != nil || got != want {
				t.Errorf("device %d (lbs %d %+d B): max lbs %d, %v; linear scan %d", device, k, delta, got, err, want)
			}
			if got > 0 && r.Peak.Reserved != reserved(got) {
				t.Errorf("device %d: report is not lbs %d's", device, got)
			}
		}
	}
}

func TestEstimateBadInput(t *testing.T) {
	cfg := moeCfg()
	l := layout(8, 8, 1, job.ShardFSDP)
	for _, b := range []Batch{{LBS: 0, Seq: 16}, {LBS: 1, Seq: 0}, {LBS: 1 << 30, Seq: 1 << 30}, {LBS: 1, Seq: 16, GradAccum: -1}} {
		if _, err := Estimate(cfg, l, b, Options{}); err == nil {
			t.Errorf("batch %+v accepted", b)
		}
	}
	for _, o := range []Options{{Attention: "sparse"}, {LossChunks: -1}, {Master: "f8"}, {Allocator: &Allocator{}}, {OptimizerImpl: "lion"}} {
		if _, err := Estimate(cfg, l, Batch{LBS: 1, Seq: 16}, o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
}

// TestPeakByHand derives one step's peaks by hand: one GPU, a vocabulary
// large enough that the loss gradients matter, full checkpointing, foreach AdamW
// (T = 2·16 = 32 tokens, V = 4096, D = 32, Ψ = 2·4096·32 + 2·9280 + 32 =
// 280,736). Every request is rounded up to 512 B.
//
// In the head's backward, when nll_loss's and log_softmax's fp32 T×V
// gradients are both live:
//
//	parameters 4Ψ by unit: 524,288 + 2·37,120 + 524,416      →  1,123,840
//	AdamW moments 8Ψ by unit: 1,048,576 + 2·74,240 + 1,048,832 → 2,246,144
//	gathered bf16 weights, last block 2·9280                    18,560 →    18,944
//	gathered bf16 weights, head 2·(32 + 131,072)               262,208 →   262,656
//	saved: token ids 8T                                             256 →       512
//	saved: two blocks' inputs 2·(2TD)                          2·2,048 →     4,096
//	saved: final-norm input 2TD, rstd 4T, LM-head input 2TD      4,224 →     4,608
//	saved: log-probabilities 4TV and labels 8T                 524,544 →   524,800
//	gradient of the log-probabilities 4TV                      524,288 →   524,288
//	gradient of the fp32 logits 4TV                            524,288 →   524,288
//	                                                                      5,234,176
//
// In the optimizer step: parameters 1,123,840 + moments 2,246,144 +
// gradients 4Ψ by unit (as the parameters, 1,123,840) + the foreach
// temporaries sqrt(v) 4Ψ by unit (1,123,840): 5,617,664, the step's peak.
func TestPeakByHand(t *testing.T) {
	cfg := denseCfg()
	cfg.Vocab = 4096
	r, err := Estimate(cfg, job.DefaultLayout(), Batch{LBS: 2, Seq: 16}, Options{AC: moe.AC{Mode: moe.ACFull}, OptimizerImpl: Foreach})
	if err != nil {
		t.Fatal(err)
	}
	if r.Peak.Allocated != 5617664 || r.Events[r.Peak.Index].Phase != Optimizer {
		t.Errorf("peak allocated %d at %s; by hand 5617664 in the optimizer step", r.Peak.Allocated, r.Events[r.Peak.Index])
	}
	var cur int64
	for _, e := range r.Events {
		n := (e.Bytes + 511) / 512 * 512
		if !e.Alloc {
			n = -n
		}
		cur += n
		if e.Label == "grad_logits_f32" && e.Alloc {
			if cur != 5234176 {
				t.Errorf("live at the head's fp32 logit gradient: %d, by hand 5234176", cur)
			}
			return
		}
	}
	t.Error("no grad_logits_f32 event")
}

// TestChunkedLossEvents derives the head's events by hand for T = 5 tokens
// (lbs 1, seq 5), V = 64, D = 32, in two loss chunks of ⌈5/2⌉ = 3 and 2
// tokens. The head keeps final-norm input 2TD = 320 B, rstd 4T = 20 B,
// LM-head input 320 B and the labels 8T = 40 B (held by the chunks'
// checkpoints): 700 B; unchunked it also keeps the log-probabilities
// 4TV = 1280 B. Per chunk of t tokens: bf16 logits 2tV, fp32 copies and
// log-probabilities 4tV (3 tokens: 384 and 768 B; 2 tokens: 256 and 512 B).
func TestChunkedLossEvents(t *testing.T) {
	cfg := denseCfg()
	b := Batch{LBS: 1, Seq: 5}
	for _, tc := range []struct {
		chunks int
		saved  int64
		events []string
	}{
		{0, 1980, []string{
			"forward +saved final_norm input 320", "forward +saved final_norm rstd 20", "forward +saved lm_head input 320",
			"forward +logits 640", "forward +logits_f32 1280", "forward +saved loss log_probs 1280", "forward +saved loss labels 40",
			"forward -logits_f32 1280", "forward -logits 640",
			"backward +grad_log_probs 1280", "backward +grad_logits_f32 1280", "backward -grad_log_probs 1280",
			"backward -saved loss log_probs 1280", "backward -saved loss labels 40",
			"backward +grad_logits 640", "backward -grad_logits_f32 1280", "backward -grad_logits 640",
			"backward -saved final_norm input 320", "backward -saved final_norm rstd 20", "backward -saved lm_head input 320",
		}},
		{2, 700, []string{
			"forward +saved final_norm input 320", "forward +saved final_norm rstd 20", "forward +saved lm_head input 320",
			"forward +saved loss labels 40",
			"forward +logits chunk 0 384", "forward +logits_f32 chunk 0 768", "forward +log_probs chunk 0 768",
			"forward -logits_f32 chunk 0 768", "forward -logits chunk 0 384", "forward -log_probs chunk 0 768",
			"forward +logits chunk 1 256", "forward +logits_f32 chunk 1 512", "forward +log_probs chunk 1 512",
			"forward -logits_f32 chunk 1 512", "forward -logits chunk 1 256", "forward -log_probs chunk 1 512",
			"backward +logits_bwd chunk 0 384", "backward +logits_f32_bwd chunk 0 768", "backward +log_probs_bwd chunk 0 768",
			"backward -logits_f32_bwd chunk 0 768", "backward -logits_bwd chunk 0 384",
			"backward +grad_log_probs chunk 0 768", "backward +grad_logits_f32 chunk 0 768", "backward -grad_log_probs chunk 0 768",
			"backward -log_probs_bwd chunk 0 768",
			"backward +grad_logits chunk 0 384", "backward -grad_logits_f32 chunk 0 768", "backward -grad_logits chunk 0 384",
			"backward +logits_bwd chunk 1 256", "backward +logits_f32_bwd chunk 1 512", "backward +log_probs_bwd chunk 1 512",
			"backward -logits_f32_bwd chunk 1 512", "backward -logits_bwd chunk 1 256",
			"backward +grad_log_probs chunk 1 512", "backward +grad_logits_f32 chunk 1 512", "backward -grad_log_probs chunk 1 512",
			"backward -log_probs_bwd chunk 1 512",
			"backward +grad_logits chunk 1 256", "backward -grad_logits_f32 chunk 1 512", "backward -grad_logits chunk 1 256",
			"backward -saved final_norm input 320", "backward -saved final_norm rstd 20", "backward -saved lm_head input 320",
			"backward -saved loss labels 40",
		}},
	} {
		r, err := Estimate(cfg, job.DefaultLayout(), b, Options{LossChunks: tc.chunks})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Saved[len(r.Saved)-1]; got != tc.saved {
			t.Errorf("chunks %d: the head keeps %d B, by hand %d", tc.chunks, got, tc.saved)
		}
		var got []string
		for _, e := range r.Events {
			if e.Layer == cfg.LayerHead() && (e.Category == CatLoss || e.Category == CatActivations) {
				sign := "-"
				if e.Alloc {
					sign = "+"
				}
				got = append(got, fmt.Sprintf("%s %s%s %d", e.Phase, sign, e.Label, e.Bytes))
			}
		}
		if !slices.Equal(got, tc.events) {
			t.Errorf("chunks %d: the head's loss and saved events\n%s\nby hand\n%s", tc.chunks, strings.Join(got, "\n"), strings.Join(tc.events, "\n"))
		}
	}
}
