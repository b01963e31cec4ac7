package memory

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// denseCfg is a small dense model whose sizes divide by 8 everywhere.
// Ψ by hand: embedding 64·32 = 2048; per layer: two norms 2·32 = 64,
// q 32·32 = 1024, k 16·32 = 512, v 512, o 1024, MLP 3·64·32 = 6144, so
// 9280; two layers 18560; final norm 32; LM head 2048. Ψ = 22688.
func denseCfg() *moe.Config {
	return &moe.Config{Name: "dense", ModelType: "llama", Vocab: 64, Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8,
		DenseFFN: 64, MoELayer: []bool{false, false}, Window: []int{0, 0}, QKNorm: moe.QKNormNone,
		RotaryFraction: 1, RopeTheta: 10000, NormEps: 1e-6, InitRange: 0.02}
}

const denseParams = 22688

// moeCfg is a small MoE model: E = 8 experts of F = 16, top-2, QK-norm per
// head, a sigmoid router with selection bias (a buffer).
func moeCfg() *moe.Config {
	return &moe.Config{Name: "moe", ModelType: "glm4_moe", Vocab: 64, Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8,
		MoELayer: []bool{true, true}, Window: []int{0, 0}, Experts: 8, TopK: 2, ExpertFFN: 16,
		Score: moe.Sigmoid, SelectionBias: true, RoutedScale: 1, Groups: 1, TopKGroups: 1, NormTopK: true,
		QKNorm: moe.QKNormHead, RotaryFraction: 1, RopeTheta: 10000, NormEps: 1e-6, InitRange: 0.02}
}

func layout(gpus, shard, ep int, s job.Sharding) job.Layout {
	return job.Layout{GPUs: gpus, DPShard: shard, DPReplicate: gpus / shard, EP: ep, Sharding: s, ReshardAfterForward: true}
}

func sum(units []Unit) (local, shard, buffers int64) {
	for _, u := range units {
		local += u.Local
		shard += u.Shard
		buffers += u.Buffers
	}
	return
}

func TestZeROClosedForms(t *testing.T) {
	cfg := denseCfg()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	const psi, n = denseParams, 8
	// ZeRO (Rajbhandari et al. 2020, §3): fp16 parameters (2), fp16
	// gradients (2), fp32 master + two moments (K = 12): stage 1 shards K,
	// stage 2 also the gradients, stage 3 everything.
	zero := Options{Precision: moe.Precision{Param: moe.BF16, Compute: moe.BF16, Grad: moe.BF16, Optimizer: moe.F32, Activation: moe.BF16}, Master: moe.F32}
	// torchtitan FSDP2 default: fp32 parameters (4), fp32 gradients (4),
	// two fp32 moments (8); the parameters are the master copy.
	def := Options{Precision: moe.DefaultPrecision}
	cases := []struct {
		name string
		o    Options
		s    job.Sharding
		want int64
	}{
		{"zero3", zero, job.ShardFSDP, (2 + 2 + 12) * psi / n},
		{"zero2", zero, job.ShardZeRO2, 2*psi + (2+12)*psi/n},
		{"zero1", zero, job.ShardZeRO1, (2+2)*psi + 12*psi/n},
		{"ddp", zero, job.ShardDDP, 16 * psi},
		{"titan-fsdp", def, job.ShardFSDP, 16 * psi / n},
		{"titan-zero2", def, job.ShardZeRO2, 4*psi + 12*psi/n},
		{"titan-zero1", def, job.ShardZeRO1, 8*psi + 8*psi/n},
		{"titan-ddp", def, job.ShardDDP, 16 * psi},
	}
	for _, c := range cases {
		units, err := Units(cfg, layout(n, n, 1, c.s))
		if err != nil {
			t.Fatal(err)
		}
		if local, _, _ := sum(units); local != psi {
			t.Fatalf("Ψ = %d, want %d by hand", local, psi)
		}
		if got := StateOf(units, c.s, c.o).Total(); got != c.want {
			t.Errorf("%s: state = %d B, want %d", c.name, got, c.want)
		}
	}
}

func TestShardPadding(t *testing.T) {
	// dim 0 of every tensor of denseCfg is 64, 32 or 16; over 3 ranks
	// torch.chunk gives ⌈64/3⌉ = 22, ⌈32/3⌉ = 11, ⌈16/3⌉ = 6 rows.
	cfg := denseCfg()
	units, err := Units(cfg, layout(3, 3, 1, job.ShardFSDP))
	if err != nil {
		t.Fatal(err)
	}
	// embedding 22·32 = 704; per layer: norms 2·11 = 22, q 11·32 = 352,
	// k 6·32 = 192, v 192, o 11·32 = 352, gate/up 2·22·32 = 1408,
	// down 11·64 = 704 → 3222; final norm 11; LM head 704.
	want := int64(704 + 2*3222 + 11 + 704)
	if _, shard, _ := sum(units); shard != want {
		t.Errorf("Ψ_shard over 3 = %d, want %d", shard, want)
	}
}

func TestExpertSharding(t *testing.T) {
	cfg := moeCfg()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// Per MoE layer: router 8·32 = 256 (+ 8 bias buffer), experts
	// 8 · 3 · 16·32 = 12288. Non-expert per layer: norms 64, q 1024,
	// k 512, v 512, o 1024, q/k norm 2·8 = 16, router 256 → 3408.
	// Outside layers: 2048 + 32 + 2048 = 4128.
	const nonExpert = 4128 + 2*3408
	const expertsPerLayer = 12288
	cases := []struct {
		gpus, ep   int
		local      int64
		shard      int64
		explaining string
	}{
		// ep 2, dp_shard 4: efsdp 2, efsdp·ep = 4 ≤ 8 → dim 0: 4 local
		// experts split over 2 → 2 per rank. Non-expert over 4 (all
		// dims divisible by 4).
		{4, 2, nonExpert + 2*expertsPerLayer/2, nonExpert/4 + 2*expertsPerLayer/4, "dim 0"},
		// ep 8, dp_shard 16: efsdp 2, 16 > 8 → dim 1: 1 local expert,
		// rows ⌈16/2⌉ = 8 of gate/up, ⌈32/2⌉ = 16 of down:
		// 8·32 + 8·32 + 16·16 = 768 per layer. Non-expert over 16:
		// outside layers 4128/16 = 258; per layer norms 2·2, q 2·32,
		// k 1·32, v 1·32, o 2·32, q/k norm ⌈8/16⌉ = 1 each, router
		// ⌈8/16⌉·32 = 32 → 4 + 64 + 32 + 32 + 64 + 2 + 32 = 230.
		{16, 8, nonExpert + 2*expertsPerLayer/8, 258 + 2*230 + 2*768, "dim 1"},
	}
	for _, c := range cases {
		units, err := Units(cfg, layout(c.gpus, c.gpus, c.ep, job.ShardFSDP))
		if err != nil {
			t.Fatal(err)
		}
		local, shard, buffers := sum(units)
		if local != c.local || shard != c.shard || buffers != 16 {
			t.Errorf("%s: local %d shard %d buffers %d, want %d %d 16", c.explaining, local, shard, buffers, c.local, c.shard)
		}
		// Buffers: fp32, never sharded, no gradient or optimizer state.
		s := StateOf(units, job.ShardFSDP, Options{Precision: moe.DefaultPrecision})
		if s.Params != 4*shard+4*16 || s.Grads != 4*shard || s.Optimizer != 8*shard {
			t.Errorf("%s: state %+v", c.explaining, s)
		}
	}
}

func TestLayoutErrors(t *testing.T) {
	cfg := moeCfg()
	for _, l := range []job.Layout{
		{GPUs: 8, DPShard: 8, DPReplicate: 1, EP: 3, Sharding: job.ShardFSDP},    // ep ∤ dp_shard
		{GPUs: 8, DPShard: 3, DPReplicate: 2, EP: 1, Sharding: job.ShardFSDP},    // 2·3 ≠ 8
		{GPUs: 16, DPShard: 16, DPReplicate: 1, EP: 16, Sharding: job.ShardFSDP}, // 16 ∤ 8 experts
		{GPUs: 8, DPShard: 8, DPReplicate: 1, EP: 1, Sharding: "zero4"},
	} {
		if _, err := Units(cfg, l); err == nil {
			t.Errorf("layout %+v accepted", l)
		}
	}
}
