package parallel

import (
	"testing"

	"github.com/moescope/moescope/memory"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
)

// TestTPCollectivesBytes: per-block tensor-parallel bytes derived by hand
// for the tiny MoE (D = 8) at tp 2 with T = 2 × 8 = 16 tokens per
// data-parallel rank, bf16 activations: every block collective is S = T·D
// = 128 elements = 256 bytes; loss parallel's all-reduces T = 16 f32 =
// 64 bytes. Counts from torchtitan's plan: forward 2 all-gathers (before
// q/k/v, before the MoE) and 2 reduce-scatters (after o_proj, after the
// MoE); backward the 4 adjoints; recompute all 4 under full, the 2
// all-gathers under selective (SAC saves reduce-scatter outputs only),
// none under none, the MoE input's all-gather under modules:layernorm.
func TestTPCollectivesBytes(t *testing.T) {
	cfg := moetest.TinyMoE()
	cfg.KVHeads = 2 // tp 2 must divide the KV heads
	l := job.Layout{GPUs: 2, TP: 2}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	if err := l.CheckModel(cfg); err != nil {
		t.Fatal(err)
	}
	const T = 16
	const S = 256 // T·D·2 bytes
	type tally struct{ fwdAG, fwdRS, recAG, recRS, bwdAG, bwdRS int64 }
	sum := func(cs []TPColl) tally {
		var y tally
		for _, c := range cs {
			switch {
			case c.Phase == PhaseForward && c.Coll == CollAllGather:
				y.fwdAG += c.Bytes()
			case c.Phase == PhaseForward && c.Coll == CollReduceScatter:
				y.fwdRS += c.Bytes()
			case c.Phase == PhaseRecompute && c.Coll == CollAllGather, c.Purpose == PurposeTPRegather:
				y.recAG += c.Bytes()
			case c.Phase == PhaseRecompute && c.Coll == CollReduceScatter:
				y.recRS += c.Bytes()
			case c.Phase == PhaseBackward && c.Coll == CollAllGather:
				y.bwdAG += c.Bytes()
			case c.Phase == PhaseBackward && c.Coll == CollReduceScatter:
				y.bwdRS += c.Bytes()
			default:
				t.Fatalf("unexpected %+v", c)
			}
		}
		return y
	}
	for _, c := range []struct {
		ac   moe.AC
		want tally
	}{
		{moe.AC{Mode: moe.ACNone}, tally{2 * S, 2 * S, 0, 0, 2 * S, 2 * S}},
		{moe.AC{Mode: moe.ACSelective}, tally{2 * S, 2 * S, 2 * S, 0, 2 * S, 2 * S}},
		{moe.AC{Mode: moe.ACFull}, tally{2 * S, 2 * S, 2 * S, 2 * S, 2 * S, 2 * S}},
		// layer:2 checkpoints block 1 only (0-based i with (i+1) mod 2 = 0).
		{moe.AC{Mode: moe.ACLayer, Every: 2}, tally{2 * S, 2 * S, 0, 0, 2 * S, 2 * S}},
		// Megatron's layernorm module re-runs the MoE block's pre-MLP norm
		// and its all-gather (the router's input) in backward; moe_act
		// moves nothing.
		{moe.AC{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm}, tally{2 * S, 2 * S, S, 0, 2 * S, 2 * S}},
		{moe.AC{Mode: moe.ACModules, Modules: moe.RecomputeMoEAct}, tally{2 * S, 2 * S, 0, 0, 2 * S, 2 * S}},
	} {
		if got := sum(TPCollectives(cfg, l, 0, T, c.ac, moe.BF16)); got != c.want {
			t.Errorf("%s, block 0: %+v, want %+v", c.ac, got, c.want)
		}
	}
	if got, want := sum(TPCollectives(cfg, l, 1, T, moe.AC{Mode: moe.ACLayer, Every: 2}, moe.BF16)),
		(tally{2 * S, 2 * S, 2 * S, 2 * S, 2 * S, 2 * S}); got != want {
		t.Errorf("layer:2, block 1: %+v, want %+v", got, want)
	}
	// Embedding: reduce-scatter forward, all-gather backward.
	if got, want := sum(TPCollectives(cfg, l, moe.LayerEmbed, T, moe.AC{Mode: moe.ACFull}, moe.BF16)), (tally{fwdRS: S, bwdAG: S}); got != want {
		t.Errorf("embedding: %+v, want %+v", got, want)
	}
	// Head: all-gather forward, reduce-scatter backward, and three f32
	// all-reduces of T values.
	var ar int64
	var rest []TPColl
	for _, c := range TPCollectives(cfg, l, cfg.LayerHead(), T, moe.AC{Mode: moe.ACSelective}, moe.BF16) {
		if c.Coll == CollAllReduce {
			ar += c.Bytes()
			continue
		}
		rest = append(rest, c)
	}
	if ar != 3*T*4 {
		t.Errorf("loss parallel all-reduces %d B, want 3 × 16 × 4 = 192", ar)
	}
	if got, want := sum(rest), (tally{fwdAG: S, bwdRS: S}); got != want {
		t.Errorf("head: %+v, want %+v", got, want)
	}
	if cs := TPCollectives(cfg, moetest.FSDPLayout(t, 2, 1, 1), 0, T, moe.AC{Mode: moe.ACFull}, moe.BF16); cs != nil {
		t.Errorf("tp 1: %v, want none", cs)
	}
}

// TestUnitTensorsTP: the schedule's FSDP geometry of a tp rank's units
// (UnitTensors) and package memory's Units count the same local and
// sharded elements: two implementations of the tensor-parallel cut.
func TestUnitTensorsTP(t *testing.T) {
	cfg := moetest.TinyMoE()
	cfg.KVHeads, cfg.SharedExperts, cfg.SharedFFN = 2, 1, 6
	for _, l := range []job.Layout{
		{GPUs: 8, TP: 2},
		{GPUs: 8, TP: 2, EP: 2, ETP: 2},
		{GPUs: 8, TP: 2, EP: 4, ETP: 1},
		{GPUs: 16, TP: 2, EP: 4, ETP: 1, DPReplicate: 2},
	} {
		l.Sharding, l.ReshardAfterForward = job.ShardFSDP, true
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		m, err := NewMesh(l, cfg, 8)
		if err != nil {
			t.Fatal(err)
		}
		us, err := memory.Units(cfg, l)
		if err != nil {
			t.Fatal(err)
		}
		x := NewUnitIndex(cfg)
		for _, mu := range us {
			var local, shard int64
			units := []Unit{{Layer: mu.Layer}}
			if mu.Layer >= 0 && mu.Layer < cfg.Layers && cfg.MoELayer[mu.Layer] {
				units = append(units, Unit{Layer: mu.Layer, Experts: true})
			}
			for _, u := range units {
				n := l.DPShard
				if u.Experts {
					n = l.ExpertShard()
				}
				for _, s := range UnitTensors(cfg, x, m, u, n) {
					local += s.Elements()
					shard += s.ShardElements()
				}
			}
			if local != mu.Local || shard != mu.Shard {
				t.Errorf("%+v layer %d: UnitTensors local %d shard %d, memory.Units %d, %d", l, mu.Layer, local, shard, mu.Local, mu.Shard)
			}
		}
	}
}

// TestScheduleTP: the schedule of a tp layout carries, per micro-step,
// exactly TPCollectives' collectives on the tp axis (besides the
// gradient all-reduces, TestScheduleTPGradSync), each after the op
// that produces its input and before the compute that reads it (every
// dependency points backwards); under async TP each all-gather and
// reduce-scatter is an exposed first chunk of S/tp plus an AsyncPart of
// the rest, moving the same elements in all.
func TestScheduleTP(t *testing.T) {
	cfg := moetest.TinyMoE()
	cfg.KVHeads = 2
	// T = lbs 2 × seq 4 = 8 tokens, divisible by 2·tp.
	for _, async := range []bool{false, true} {
		l := job.Layout{GPUs: 4, TP: 2, EP: 2, AsyncTP: async, Sharding: job.ShardFSDP, ReshardAfterForward: true}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		for _, ac := range []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}} {
			s := schedFor(t, cfg, l, ac, 2)
			var want, got int64
			parts := 0
			for lay := moe.LayerEmbed; lay <= cfg.LayerHead(); lay++ {
				for _, c := range TPCollectives(cfg, l, lay, 8, ac, moe.BF16) {
					want += 2 * c.Elements // two micro-steps
				}
			}
			for _, o := range s.Ops {
				for _, d := range o.Deps {
					if d >= o.ID {
						t.Fatalf("async %v %s: op %d depends on later op %d", async, ac, o.ID, d)
					}
				}
				if o.Type != OpCollective || o.Axis != AxisTP || o.Purpose == PurposeTPGradSync {
					continue // the gradient all-reduces: TestScheduleTPGradSync
				}
				got += o.Elements
				if o.AsyncPart {
					parts++
					if o.Coll == CollAllReduce {
						t.Errorf("loss-parallel all-reduce split: %v", o)
					}
				}
			}
			if got != want {
				t.Errorf("async %v %s: tp collectives move %d elements, TPCollectives %d", async, ac, got, want)
			}
			if async != (parts > 0) {
				t.Errorf("async %v %s: %d overlapped parts", async, ac, parts)
			}
		}
	}
}

// TestScheduleTPGradSync: the all-reduce over tp of each unit's replicated
// tensors' gradients, derived by hand for the tiny MoE (D = 8, 2 MoE
// blocks, 4 experts, head_dim 4, per-head q/k norms) at tp 2: a block's
// dense unit holds attention_norm 8 + ffn_norm 8 + q_norm 4 + k_norm 4 +
// router gate 4 × 8 = 32, S = 56 elements; the head unit the final norm,
// S = 8; the embedding (vocabulary rows) and the expert units (split or
// whole experts) none. Each runs once per unit and micro-step, in bf16
// (FSDP2's unsharded gradient, param_dtype), right before that unit's
// reduce-scatter, which waits for it. Under grad-sync-last-only with 2
// micro-steps only the last micro-step's run, in f32 (FSDP2 accumulates
// the unsharded gradients in the reduce type).
func TestScheduleTPGradSync(t *testing.T) {
	cfg := moetest.TinyMoE()
	cfg.KVHeads = 2
	want := map[int]int64{0: 56, 1: 56, cfg.LayerHead(): 8}
	for _, last := range []bool{false, true} {
		l := job.Layout{GPUs: 4, TP: 2, EP: 2, Sharding: job.ShardFSDP, ReshardAfterForward: true, GradSyncLastOnly: last}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		s := schedFor(t, cfg, l, moe.AC{Mode: moe.ACSelective}, 2)
		wantDT, micros := moe.BF16, []int{0, 1}
		if last {
			wantDT, micros = moe.F32, []int{1}
		}
		seen := map[[2]int]int{}
		for _, o := range s.Ops {
			if o.Purpose != PurposeTPGradSync {
				continue
			}
			if o.Coll != CollAllReduce || o.Axis != AxisTP || o.DType != wantDT || o.Unit.Experts || o.Elements != want[o.Layer] {
				t.Errorf("last-only %v: %+v; want a %s all-reduce on tp of %d elements", last, o, wantDT, want[o.Layer])
			}
			seen[[2]int{o.Micro, o.Layer}]++
			var rs *ScheduleOp
			for _, x := range s.Ops[o.ID+1:] {
				if x.Purpose == PurposeGradReduce && x.Unit == o.Unit && x.Micro == o.Micro {
					rs = &x
					break
				}
			}
			if rs == nil || len(rs.Deps) != 1 || rs.Deps[0] != o.ID {
				t.Errorf("last-only %v: unit %v micro %d: its reduce-scatter %v does not wait for the tp all-reduce %d", last, o.Unit, o.Micro, rs, o.ID)
			}
		}
		if len(seen) != len(micros)*len(want) {
			t.Errorf("last-only %v: tp gradient all-reduces at %v, want one per micro-step %v and layer of %v", last, seen, micros, want)
		}
		for _, m := range micros {
			for layer := range want {
				if seen[[2]int{m, layer}] != 1 {
					t.Errorf("last-only %v: micro %d layer %d: %d tp gradient all-reduces, want 1", last, m, layer, seen[[2]int{m, layer}])
				}
			}
		}
	}
}
