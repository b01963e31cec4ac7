package memory

import (
	"testing"

	"github.com/moescope/moescope/moe/job"
)

// TestEstimateCP: under cp the timeline is the folded run's (cp folded
// into dp_shard, seq/cp tokens: every activation, the logits and the loss
// of the rank's shard) plus the K/V exchange buffers of each block, sized
// by hand for tpDense (kv_heads 2, head_dim 2, bf16): one shard's K and V
// at lbs 1, seq 32, cp 4 is 8 tokens × 2 × 2 × 2 (K and V) × 2 bytes = 128;
// forward holds cp = 4 shards (512 bytes); backward 2·cp = 8 shards under
// allgather (1024), 4 under a ring (512).
func TestEstimateCP(t *testing.T) {
	cfg := tpDense()
	for _, c := range []struct {
		method   job.CPMethod
		fwd, bwd int64
	}{{job.CPAllGather, 512, 1024}, {job.CPP2P, 512, 512}, {job.CPAllToAll, 512, 512}} {
		l := job.Layout{GPUs: 8, CP: 4, CPMethod: c.method}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		o := Options{}
		got, err := Estimate(cfg, l, Batch{LBS: 1, Seq: 32}, o)
		if err != nil {
			t.Fatal(err)
		}
		folded := job.Layout{GPUs: 8}
		if err := folded.Resolve(); err != nil {
			t.Fatal(err)
		}
		want, err := Estimate(cfg, folded, Batch{LBS: 1, Seq: 8}, o)
		if err != nil {
			t.Fatal(err)
		}
		var rest []Event
		kv := map[string]int64{}
		for _, e := range got.Events {
			if e.Label == "cp_kv" || e.Label == "cp_kv_bwd" {
				if e.Category != CatComm {
					t.Errorf("%s: %s in %s, want %s", c.method, e.Label, e.Category, CatComm)
				}
				if e.Alloc {
					kv[e.Label] = e.Bytes
				}
				continue
			}
			rest = append(rest, e)
		}
		if kv["cp_kv"] != c.fwd || kv["cp_kv_bwd"] != c.bwd {
			t.Errorf("%s: exchange buffers forward %d, backward %d bytes; want %d, %d", c.method, kv["cp_kv"], kv["cp_kv_bwd"], c.fwd, c.bwd)
		}
		if len(rest) != len(want.Events) {
			t.Fatalf("%s: %d events besides the exchange buffers, folded run %d", c.method, len(rest), len(want.Events))
		}
		for i := range rest {
			if rest[i] != want.Events[i] {
				t.Fatalf("%s: event %d = %+v, folded run's %+v", c.method, i, rest[i], want.Events[i])
			}
		}
	}
}

// TestEstimatePipelineCP: a pipeline stage under cp holds the folded
// stage's timeline (cp folded into dp_shard, seq/cp tokens) plus each
// block's K/V exchange buffers, on every pipeline rank. Sized by hand for
// tpDense with two layers (pp 2, one block a stage), lbs 2 of
// pp_microbatch_size 1, seq 32, cp 4: a micro-batch's shard is 8 tokens;
// its K and V are 8 × 2 kv heads × 2 head_dim × 2 × 2 bytes = 128, so
// forward holds cp = 4 shards (512), backward 2·cp (1024) under allgather,
// 4 (512) under a ring; the pipeline's messages and receive buffers are
// the shard's hidden states, 8 tokens × hidden 8 × 2 bytes = 128 (Megatron-
// LM d98e8a64 schedules.py get_tensor_shapes: seq/cp/tp × mbs × hidden).
func TestEstimatePipelineCP(t *testing.T) {
	cfg := tpDense()
	cfg.Layers, cfg.MoELayer, cfg.Window = 2, []bool{false, false}, []int{0, 0}
	for _, c := range []struct {
		method   job.CPMethod
		fwd, bwd int64
	}{{job.CPAllGather, 512, 1024}, {job.CPP2P, 512, 512}} {
		for _, impl := range []job.PPImpl{"", job.PPMegatron} {
			l := job.Layout{GPUs: 8, PP: 2, CP: 4, CPMethod: c.method, PPImpl: impl}
			if impl == job.PPMegatron {
				l.Sharding = job.ShardZeRO1 // Megatron's distributed optimizer
			}
			if err := l.Resolve(); err != nil {
				t.Fatal(err)
			}
			got, err := Estimate(cfg, l, Batch{LBS: 2, Seq: 32}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			folded := job.Layout{GPUs: 8, PP: 2, DPShard: 4, PPImpl: impl, Sharding: l.Sharding}
			if err := folded.Resolve(); err != nil {
				t.Fatal(err)
			}
			want, err := Estimate(cfg, folded, Batch{LBS: 2, Seq: 8}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Stage != want.Stage || len(got.Stages) != 2 {
				t.Fatalf("%s %s: worst rank %d of %d, folded run's %d", c.method, impl, got.Stage, len(got.Stages), want.Stage)
			}
			var rest []Event
			kv := map[string]int64{}
			for _, e := range got.Events {
				switch e.Label {
				case "cp_kv", "cp_kv_bwd":
					if e.Alloc {
						kv[e.Label] = e.Bytes
					}
					continue
				case labelRecvInput, labelRecvGrad, labelOutput:
					if e.Bytes != 128 {
						t.Errorf("%s %s: %s of %d bytes, want 128", c.method, impl, e.Label, e.Bytes)
					}
				}
				rest = append(rest, e)
			}
			if kv["cp_kv"] != c.fwd || kv["cp_kv_bwd"] != c.bwd {
				t.Errorf("%s %s: exchange buffers forward %d, backward %d bytes; want %d, %d", c.method, impl, kv["cp_kv"], kv["cp_kv_bwd"], c.fwd, c.bwd)
			}
			if len(rest) != len(want.Events) {
				t.Fatalf("%s %s: %d events besides the exchange buffers, folded run %d", c.method, impl, len(rest), len(want.Events))
			}
			for i := range rest {
				if rest[i] != want.Events[i] {
					t.Fatalf("%s %s: event %d = %+v, folded run's %+v", c.method, impl, i, rest[i], want.Events[i])
				}
			}
		}
	}
}

// TestEstimatePipelineCPZeroBubble: under ZBVZeroBubble a backward is split
// into an input pass, which runs attention's backward and so holds the
// blocks' backward K/V exchange buffers, and a weight pass, which does not.
// tpDense with four layers, one a stage (pp_layers 1,1,1,1: rank 0 holds
// stages 0 and 3, rank 1 stages 1 and 2), lbs 2 of 1, seq 32, cp 4,
// allgather: 2·cp shards of 128 bytes = 1024 per block and micro-batch
// (TestEstimatePipelineCP's count); the worst rank holds two blocks, so
// 2 blocks × 2 micro-batches = 4 allocations, and no other event differs
// from the folded run's.
func TestEstimatePipelineCPZeroBubble(t *testing.T) {
	cfg := tpDense()
	cfg.Layers, cfg.MoELayer, cfg.Window = 4, []bool{false, false, false, false}, []int{0, 0, 0, 0}
	l := job.Layout{GPUs: 8, PP: 2, CP: 4, PPSchedule: job.PPZBVZeroBubble, PPLayers: "1,1,1,1"}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	got, err := Estimate(cfg, l, Batch{LBS: 2, Seq: 32}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	folded := job.Layout{GPUs: 8, PP: 2, DPShard: 4, PPSchedule: job.PPZBVZeroBubble, PPLayers: "1,1,1,1"}
	if err := folded.Resolve(); err != nil {
		t.Fatal(err)
	}
	want, err := Estimate(cfg, folded, Batch{LBS: 2, Seq: 8}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var rest []Event
	n := 0
	for _, e := range got.Events {
		switch e.Label {
		case "cp_kv_bwd":
			if e.Alloc {
				n++
				if e.Bytes != 1024 {
					t.Errorf("cp_kv_bwd of %d bytes, want 1024", e.Bytes)
				}
			}
			continue
		case "cp_kv":
			continue
		}
		rest = append(rest, e)
	}
	if n != 4 {
		t.Errorf("%d backward exchange buffers on rank %d, want 4", n, got.Stage)
	}
	if len(rest) != len(want.Events) {
		t.Fatalf("%d events besides the exchange buffers, folded run %d", len(rest), len(want.Events))
	}
	for i := range rest {
		if rest[i] != want.Events[i] {
			t.Fatalf("event %d = %+v, folded run's %+v", i, rest[i], want.Events[i])
		}
	}
}
