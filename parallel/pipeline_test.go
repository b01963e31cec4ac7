package parallel

import (
	"fmt"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
)

// TestBuildPipeline checks the per-rank programs against the pipeline's
// rules (pipeline.go): every send has exactly one receive of the same
// micro-batch, direction and size on the peer stage's rank; each rank
// computes every (stage, micro-batch) of its stages once forward and once
// backward per step (a full backward, or an input then a weight pass), in
// job.PipelineOrder's order, on its stage's rank; FSDP gathers run once
// per stage per step before its first forward, gradient reductions once
// per stage per accumulation micro-step after its last backward or weight
// pass; neighbouring stages on one rank (the bottom of a V) exchange no
// message, so there are 2·(boundaries between ranks)·m·accum messages.
func TestBuildPipeline(t *testing.T) {
	small := moetest.TinyMoELayers(true, false, true, true)
	eight := moetest.TinyMoELayers(true, false, true, true, true, false, true, true)
	for _, lt := range []job.Layout{
		{GPUs: 4, PP: 2, DPShard: 2},
		{GPUs: 8, PP: 2, DPShard: 2, DPReplicate: 2, PPSchedule: job.PPInterleaved1F1B},
		{GPUs: 8, PP: 4, EP: 2, PPSchedule: job.PPGPipe},
		{GPUs: 8, PP: 2, DPShard: 4, EP: 2, PPSchedule: job.PPZBVZeroBubble},
		{GPUs: 8, PP: 4, DPShard: 2, PPSchedule: job.PPZBVZeroBubble, PPLayers: "1,1,1,1,1,1,1,1"},
		{GPUs: 4, PP: 2, DPShard: 2, PPSchedule: job.PPInterleavedZeroBubble},
		{GPUs: 4, PP: 2, DPShard: 2, PPSchedule: job.PPDualPipeV},
	} {
		l := lt
		cfg := small
		if l.PPLayers != "" {
			cfg = eight
		}
		l.ReshardAfterForward = false
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		const lbs, accum = 4, 2
		p, err := BuildPipeline(PipelineSpec{Spec: job.Spec{Model: cfg, Layout: l, Batch: job.Batch{LBS: lbs, Seq: 8, GradAccum: accum}, Recipe: job.EagerRecipe()}, GPUsPerNode: 8})
		if err != nil {
			t.Fatalf("%+v: %v", l, err)
		}
		name := fmt.Sprintf("pp %d %s v %d dp_shard %d rep %d", l.PP, l.PPSchedule, l.PPVirtualStages, l.DPShard, l.DPReplicate)
		n := l.PipelineStages()
		order, _ := job.PipelineOrder(l.PPSchedule, l.PP, l.PPVirtualStages, p.M)
		type msg struct {
			from, to, micro int
			grad            bool
		}
		sends, recvs := map[msg]int{}, map[msg]int{}
		msgBytes := int64(l.PPMicrobatchSize) * 8 * int64(cfg.Hidden) * 2 // bf16 hidden states
		for r, ops := range p.Ranks {
			var compute []job.PipeAction
			gathers, reduces := map[int]int{}, map[int]int{}
			for _, o := range ops {
				if l.StageRank(o.Stage) != r {
					t.Fatalf("%s: rank %d runs an op of stage %d", name, r, o.Stage)
				}
				switch o.Kind {
				case PipeForward, PipeBackward, PipeInput, PipeWeight:
					kind := map[PipeOpKind]job.PipeKind{PipeForward: job.PipeF, PipeBackward: job.PipeB, PipeInput: job.PipeI, PipeWeight: job.PipeW}[o.Kind]
					if acc := o.Micro / p.M; acc == 0 {
						compute = append(compute, job.PipeAction{Kind: kind, Stage: o.Stage, Micro: o.Micro})
					}
				case PipeSend:
					sends[msg{o.Stage, o.Peer, o.Micro, o.Grad}]++
					if o.Bytes != msgBytes {
						t.Errorf("%s: message of %d B, want %d", name, o.Bytes, msgBytes)
					}
				case PipeRecv:
					recvs[msg{o.Peer, o.Stage, o.Micro, o.Grad}]++
				case PipeColl:
					if o.Coll.Purpose == PurposeGather {
						gathers[o.Stage]++
					} else {
						reduces[o.Stage]++
					}
				}
			}
			if fmt.Sprint(compute) != fmt.Sprint(order[r]) {
				t.Errorf("%s rank %d: compute order %v, want %v", name, r, compute, order[r])
			}
			for _, s := range l.RankStages(r) {
				// Dense units shard over dp_shard, routed experts over
				// dp_shard/ep; replicas all-reduce every unit.
				units := p.StageUnits(cfg, s)
				wantG := 0
				for _, u := range units {
					if !u.Experts && l.DPShard > 1 || u.Experts && l.ExpertShard() > 1 {
						wantG++
					}
				}
				if gathers[s] != wantG {
					t.Errorf("%s stage %d: %d gathers, want %d (once per sharded unit per step)", name, s, gathers[s], wantG)
				}
				wantR := wantG
				if l.DPReplicate > 1 {
					wantR += len(units)
				}
				if reduces[s] != accum*wantR {
					t.Errorf("%s stage %d: %d reductions, want %d (per unit per micro-step)", name, s, reduces[s], accum*wantR)
				}
			}
		}
		remote := 0 // stage boundaries between two ranks
		for s := 0; s+1 < n; s++ {
			if l.StageRank(s) != l.StageRank(s+1) {
				remote++
			}
		}
		if l.PPSchedule.VShaped() && remote != n-2 {
			t.Errorf("%s: %d boundaries between ranks, want all but the V's bottom, %d", name, remote, n-2)
		}
		want := 2 * remote * p.M * accum
		if len(sends) != want || len(recvs) != want {
			t.Errorf("%s: %d sends, %d receives, want %d each", name, len(sends), len(recvs), want)
		}
		for k, c := range sends {
			if c != 1 || recvs[k] != 1 {
				t.Errorf("%s: message %+v sent %d, received %d times", name, k, c, recvs[k])
			}
		}
	}
}

func TestMeshRefusesPipeline(t *testing.T) {
	l := job.Layout{GPUs: 4, PP: 2}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	if _, err := NewMesh(l, nil, 8); err == nil {
		t.Fatal("NewMesh accepted pp = 2")
	}
	if m, err := NewMesh(l.StageLayout(), nil, 8); err != nil || m.World() != 2 {
		t.Fatalf("stage mesh: %v, %v", m, err)
	}
}

// TestBuildPipelineTP: tensor parallelism inside pipeline stages, by hand
// for the tiny model of blocks MoE, dense, MoE, MoE (D = 8, head_dim 4, 2
// KV heads, 4 experts) at pp 2 × dp_shard 2 × tp 2, lbs 4 in micro-batches
// of 1 sequence of 8 tokens (M = 4), grad-accum 2, selective policy.
// torchtitan's split of 4 layers + 2 over 2 stages is 2, 2: stage 0 holds
// the embedding and blocks 0, 1; stage 1 blocks 2, 3 and the head.
//   - A message is a tp rank's sequence shard: 1 × 8/2 tokens × 8 × 2 B =
//     64 B (128 B without tp).
//   - Each stage's reduction starts each unit's with the all-reduce over tp
//     of its replicated tensors' gradients, in f32 (accumulated over M = 4
//     backwards): a MoE block's 8 + 8 + 4 + 4 + 4·8 = 56 elements (norms,
//     q/k norms, router gate), the dense block's 24, the head's final norm
//     8, none for the embedding or the experts; backward unit order, so
//     stage 0 runs 24, 56 and stage 1 8, 56, 56, once per micro-step.
//   - One micro-batch through stage 0 runs the embedding's reduce-scatter
//     and all-gather and each block's 4 forward, 2 re-gathered and 4
//     backward collectives, 22 of T·D = 64 elements; stage 1 its blocks'
//     20 and the head's all-gather, reduce-scatter and three loss-parallel
//     all-reduces of T = 8 f32 values.
func TestBuildPipelineTP(t *testing.T) {
	cfg := moetest.TinyMoELayers(true, false, true, true)
	cfg.KVHeads = 2
	l := job.Layout{GPUs: 8, PP: 2, DPShard: 2, TP: 2}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	ac := moe.AC{Mode: moe.ACSelective}
	p, err := BuildPipeline(PipelineSpec{Spec: job.Spec{Model: cfg, Layout: l, Batch: job.Batch{LBS: 4, Seq: 8, GradAccum: 2}, Recipe: job.EagerRecipe()}, GPUsPerNode: 8})
	if err != nil {
		t.Fatal(err)
	}
	if p.Stage.World() != 4 || p.Stage.Group(AxisTP, 0).Size() != 2 {
		t.Fatalf("stage mesh of %d ranks, tp group of %d; want 4 and 2", p.Stage.World(), p.Stage.Group(AxisTP, 0).Size())
	}
	wantSync := [][]int64{{24, 56}, {8, 56, 56}}
	for r, ops := range p.Ranks {
		var sync []int64
		for _, o := range ops {
			switch {
			case o.Kind == PipeSend && o.Bytes != 64:
				t.Errorf("rank %d: message of %d B, want 64", r, o.Bytes)
			case o.Kind == PipeColl && o.Coll.Purpose == PurposeTPGradSync:
				if o.Coll.Axis != AxisTP || o.Coll.Coll != CollAllReduce || o.Coll.DType != moe.F32 {
					t.Errorf("rank %d: %+v; want an f32 all-reduce on tp", r, o.Coll)
				}
				sync = append(sync, o.Coll.Elements)
			}
		}
		want := append(append([]int64(nil), wantSync[r]...), wantSync[r]...) // two micro-steps
		if fmt.Sprint(sync) != fmt.Sprint(want) {
			t.Errorf("rank %d: tp gradient all-reduces of %v elements, want %v", r, sync, want)
		}
		cs := p.StageTPCollectives(cfg, r, 8, ac, moe.BF16)
		n, loss := 0, 0
		for _, c := range cs {
			switch {
			case c.Purpose == PurposeTPLoss && c.Elements == 8 && c.DType == moe.F32:
				loss++
			case c.Elements == 64 && c.DType == moe.BF16:
				n++
			default:
				t.Errorf("stage %d: %+v", r, c)
			}
		}
		if wantN, wantLoss := []int{22, 22}[r], []int{0, 3}[r]; n != wantN || loss != wantLoss {
			t.Errorf("stage %d: %d collectives of T·D and %d loss-parallel ones, want %d and %d", r, n, loss, wantN, wantLoss)
		}
	}
}

// A pipeline's gradient collectives move the reduce type the spec names:
// FSDP2's reduce_dtype (MixedPrecisionPolicy) is the type of its
// reduce-scatter, of the replicas' all-reduce and, when micro-batches
// accumulate without sync, of the tp all-reduce of replicated gradients;
// unset, it is the gradient type (f32 by default).
func TestBuildPipelineReduceDType(t *testing.T) {
	cfg := moetest.TinyMoELayers(true, false, true, true)
	cfg.KVHeads = 2
	l := job.Layout{GPUs: 16, PP: 2, DPReplicate: 2, DPShard: 2, TP: 2}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		reduce, want moe.DType
	}{{"", moe.F32}, {moe.F32, moe.F32}, {moe.BF16, moe.BF16}} {
		rec := job.EagerRecipe()
		rec.ReduceDType = c.reduce
		p, err := BuildPipeline(PipelineSpec{Spec: job.Spec{Model: cfg, Layout: l, Batch: job.Batch{LBS: 4, Seq: 8, GradAccum: 1}, Recipe: rec}, GPUsPerNode: 8})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[Purpose]int{}
		for r, ops := range p.Ranks {
			for _, o := range ops {
				if o.Kind != PipeColl {
					continue
				}
				switch o.Coll.Purpose {
				case PurposeGradReduce, PurposeGradReplica, PurposeTPGradSync:
					seen[o.Coll.Purpose]++
					if o.Coll.DType != c.want {
						t.Errorf("reduce_dtype %q: rank %d: %s %s in %s, want %s", c.reduce, r, o.Coll.Purpose, o.Coll.Coll, o.Coll.DType, c.want)
					}
				}
			}
		}
		for _, pu := range []Purpose{PurposeGradReduce, PurposeGradReplica, PurposeTPGradSync} {
			if seen[pu] == 0 {
				t.Errorf("reduce_dtype %q: no %s collective in the pipeline", c.reduce, pu)
			}
		}
	}
}
