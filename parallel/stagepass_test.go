package parallel

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
)

// stagePassPipeline builds the pipeline of cfg under l: one sequence of 8
// tokens per micro-batch, one micro-batch.
func stagePassPipeline(t *testing.T, cfg *moe.Config, l job.Layout) *Pipeline {
	t.Helper()
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	p, err := BuildPipeline(PipelineSpec{Spec: job.Spec{Model: cfg, Layout: l, Batch: job.Batch{LBS: 1, Seq: 8, GradAccum: 1}, Recipe: job.EagerRecipe()}, GPUsPerNode: 8})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestStagePassAsSchedule: a stage's passes are BuildSchedule's ops for the
// stage's layers. The tiny MoE at tp 2 (× ep 2 at etp 1) without pp, one
// micro-step of one sequence, under none, selective, full and the modules
// policy's moe, is the schedule of reference; at pp 2 the
// forward passes of stages 0 and 1, then the backward passes of stages 1
// and 0, list the same compute segments, all-to-alls and tp collectives
// (exposed chunks and, under async TP, overlapped parts) in the same
// order, with the reference's dependencies inside the pass (the reference
// has more: its chain and due overlapped parts run on across stage
// boundaries).
// The reference's FSDP-side ops (the replicated gradients' all-reduce, the
// loss all-gather) and the optimizer are the pipeline program's, not a
// pass's. Each stage's two passes run StageTPCollectives' list in order,
// an overlapped part and its exposed chunk summing to one collective.
func TestStagePassAsSchedule(t *testing.T) {
	cfg := moetest.TinyMoE()
	cfg.KVHeads = 2
	for _, async := range []bool{false, true} {
		for _, ep := range []int{1, 2} {
			for _, ac := range []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}, {Mode: moe.ACModules, Modules: moe.RecomputeMoE}} {
				name := fmt.Sprintf("async %v ep %d %s", async, ep, ac)
				ref := job.Layout{GPUs: 2, TP: 2, EP: ep, AsyncTP: async, Sharding: job.ShardFSDP, ReshardAfterForward: true}
				if err := ref.Resolve(); err != nil {
					t.Fatal(err)
				}
				m, err := NewMesh(ref, cfg, 8)
				if err != nil {
					t.Fatal(err)
				}
				s, err := BuildSchedule(ScheduleSpec{Spec: job.Spec{Model: cfg, AC: ac, Batch: job.Batch{LBS: 1, Seq: 8, GradAccum: 1}, Recipe: job.EagerRecipe()}, Mesh: m, NoMemory: true})
				if err != nil {
					t.Fatal(err)
				}
				var want []ScheduleOp
				for _, o := range s.Ops {
					if o.Phase == PhaseOptimizer || o.Purpose == PurposeTPGradSync || o.Purpose == PurposeLoss {
						continue
					}
					want = append(want, o)
				}
				p := stagePassPipeline(t, cfg, job.Layout{GPUs: 4, PP: 2, TP: 2, EP: ep, AsyncTP: async})
				var got [][]ScheduleOp
				for _, pass := range []struct {
					stage int
					bwd   bool
				}{{0, false}, {1, false}, {1, true}, {0, true}} {
					ops, err := p.StagePass(cfg, pass.stage, 8, ac, moe.Precision{}, pass.bwd)
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, ops)
				}
				at := 0
				for k, ops := range got {
					start := at // the pass's op d is want[start+d]
					for _, o := range ops {
						if at >= len(want) {
							t.Fatalf("%s: pass %d has more ops than the schedule", name, k)
						}
						w := want[at]
						if o.Type != w.Type || o.Layer != w.Layer || o.Phase != w.Phase || o.Segment != w.Segment || o.Coll != w.Coll ||
							o.Axis != w.Axis || o.Purpose != w.Purpose || o.DType != w.DType || o.Elements != w.Elements || o.AsyncPart != w.AsyncPart {
							t.Fatalf("%s: pass %d op %d %+v; the schedule's %+v", name, k, o.ID, o, w)
						}
						inPass := map[int]int{} // the reference's ids of this pass so far → the pass's
						for i := start; i < at; i++ {
							inPass[want[i].ID] = i - start
						}
						for _, wd := range w.Deps {
							if d, ok := inPass[wd]; ok && !slices.Contains(o.Deps, d) {
								t.Errorf("%s: pass %d op %d does not wait for %d as the schedule's op %d waits for %d", name, k, o.ID, d, w.ID, wd)
							}
						}
						for _, d := range o.Deps {
							found := false
							for _, wd := range w.Deps {
								found = found || wd == want[start+d].ID
							}
							if !found {
								t.Errorf("%s: pass %d op %d waits for %d, the schedule's op %d not for %d (deps %v)", name, k, o.ID, d, w.ID, want[start+d].ID, w.Deps)
							}
						}
						at++
					}
				}
				if at != len(want) {
					t.Errorf("%s: passes hold %d ops, the schedule %d", name, at, len(want))
				}
				// The collectives the numeric backend runs per micro-batch
				// (StageTPCollectives), one op each or an exposed chunk and
				// its overlapped part.
				for s, passes := range [][]int{{0, 3}, {1, 2}} {
					var listed, run []string
					for _, c := range p.StageTPCollectives(cfg, s, 8, ac, moe.BF16) {
						listed = append(listed, fmt.Sprint(c.Coll, c.Purpose, c.Elements))
					}
					for _, k := range passes {
						for _, o := range got[k] {
							switch {
							case o.Type != OpCollective || o.Axis != AxisTP:
							case o.AsyncPart:
								run[len(run)-1] = fmt.Sprint(o.Coll, o.Purpose, o.Elements+got[k][o.Deps[0]].Elements)
							default:
								run = append(run, fmt.Sprint(o.Coll, o.Purpose, o.Elements))
							}
						}
					}
					if !slices.Equal(run, listed) {
						t.Errorf("%s: stage %d's passes run tp collectives %v, StageTPCollectives lists %v", name, s, run, listed)
					}
				}
			}
		}
	}
}

// TestStagePassAsyncBytes: each stage's tp collectives per micro-batch
// under async TP, by hand. The tiny MoE (D = 8, 2 MoE blocks, KV heads 2)
// at pp 2 × tp 2, one sequence of 8 tokens per micro-batch: S = 8 × 8 =
// 64 elements of bf16, 128 B per all-gather or reduce-scatter; async TP
// exposes the first of tp = 2 chunks, 64 B, and overlaps the other 64 B.
// Stage 0 holds the embedding and block 0, stage 1 block 1 and the head
// (torchtitan's split of 2 + 2 effective layers). Forward: stage 0 runs
// the embedding's reduce-scatter and the block's all-gather,
// reduce-scatter, all-gather, reduce-scatter: 5 split collectives, 320 B
// exposed + 320 B overlapped; stage 1 the block's 4 and the head's
// all-gather, 320 + 320 B, and loss parallel's three all-reduces of 8 f32
// values, 3 × 32 = 96 B, not split (exposed whole). Backward under
// selective AC: a block re-gathers its two all-gathers, all-gathers the
// output gradient, then reduce-scatters, all-gathers, reduce-scatters: 6;
// stage 0 adds the embedding's output-gradient all-gather, stage 1 the
// head's input-gradient reduce-scatter: 7 each, 448 + 448 B. Under full AC
// a block's backward is its 4 forward collectives re-run and 4 backward
// ones: 9 per stage, 576 + 576 B. Without async TP nothing is overlapped
// and each stage moves the same bytes in whole collectives.
func TestStagePassAsyncBytes(t *testing.T) {
	cfg := moetest.TinyMoE()
	cfg.KVHeads = 2
	type bytes struct{ exposed, overlapped, whole int64 }
	for _, c := range []struct {
		ac       moe.AC
		fwd, bwd [2]bytes // per stage
	}{
		{moe.AC{Mode: moe.ACSelective}, [2]bytes{{320, 320, 0}, {320 + 96, 320, 96}}, [2]bytes{{448, 448, 0}, {448, 448, 0}}},
		{moe.AC{Mode: moe.ACFull}, [2]bytes{{320, 320, 0}, {320 + 96, 320, 96}}, [2]bytes{{576, 576, 0}, {576, 576, 0}}},
	} {
		for _, async := range []bool{true, false} {
			p := stagePassPipeline(t, cfg, job.Layout{GPUs: 4, PP: 2, TP: 2, AsyncTP: async})
			for s := range 2 {
				for _, bwd := range []bool{false, true} {
					ops, err := p.StagePass(cfg, s, 8, c.ac, moe.Precision{}, bwd)
					if err != nil {
						t.Fatal(err)
					}
					var got bytes
					for _, o := range ops {
						if o.Type != OpCollective || o.Axis != AxisTP {
							continue
						}
						switch {
						case o.AsyncPart:
							got.overlapped += o.Bytes()
						case o.Coll == CollAllReduce:
							got.whole += o.Bytes()
							got.exposed += o.Bytes()
						default:
							got.exposed += o.Bytes()
						}
					}
					want := c.fwd[s]
					if bwd {
						want = c.bwd[s]
					}
					if !async {
						// The same bytes, all in whole exposed collectives.
						want = bytes{want.exposed + want.overlapped, 0, want.whole}
					}
					if got != want {
						t.Errorf("%s async %v stage %d backward %v: %+v B, want %+v", c.ac, async, s, bwd, got, want)
					}
				}
			}
		}
	}
}

// TestStagePassErrors: a stage out of range, a missing config or a
// sequence length below 1 is an error naming it.
func TestStagePassErrors(t *testing.T) {
	cfg := moetest.TinyMoE()
	cfg.KVHeads = 2
	p := stagePassPipeline(t, cfg, job.Layout{GPUs: 4, PP: 2, TP: 2, AsyncTP: true})
	for _, c := range []struct {
		cfg  *moe.Config
		s    int
		seq  int
		want string
	}{
		{cfg, 2, 8, "stage 2: must be in [0, 2)"},
		{cfg, -1, 8, "stage -1: must be in [0, 2)"},
		{cfg, 0, 0, "seq = 0: must be ≥ 1"},
		{nil, 0, 8, "config is required"},
	} {
		_, err := p.StagePass(c.cfg, c.s, c.seq, moe.AC{Mode: moe.ACSelective}, moe.Precision{}, false)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("StagePass(stage %d, seq %d): %v; want an error containing %q", c.s, c.seq, err, c.want)
		}
	}
}
