package parallel

import (
	"testing"

	"github.com/moescope/moescope/moe"
)

func benchSimulate(b *testing.B, gpus int) {
	cfg, err := moe.Load("qwen3-30b-a3b")
	if err != nil {
		b.Fatal(err)
	}
	l := moe.Layout{GPUs: gpus, DPShard: 64, EP: 8, Sharding: moe.ShardFSDP, ReshardAfterForward: true}
	if err := l.Resolve(); err != nil {
		b.Fatal(err)
	}
	in := SimInput{Config: cfg, Layout: l, AC: moe.AC{Mode: moe.ACSelective}, LBS: 2, Seq: 4096, GradAccum: 2}
	for b.Loop() {
		if _, err := Simulate(in); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSimulate512 and 4096: Qwen3-30B-A3B, HSDP dp_shard 64 × ep 8,
// selective AC, lbs 2, seq 4096, 2 micro-steps, B200 hgx.
func BenchmarkSimulate512(b *testing.B)  { benchSimulate(b, 512) }
func BenchmarkSimulate4096(b *testing.B) { benchSimulate(b, 4096) }
