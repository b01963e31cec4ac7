package cost

import (
	"testing"

	"github.com/moescope/moescope/moe"
)

// TestFusedQKV, worked by hand on testSpec (132 SMs, 800 TFLOP/s GEMMs,
// 2 TB/s effective HBM, a 5 µs launch) for hidden 1024, 8 heads and 2 KV
// heads of 128 (q width 1024, k and v 256 each) over 128 rows:
//
//   - forward: q is 1×8 tiles, k and v 1×2 each, every one a single wave
//     of 132 tile slots of 2·128²·1024 FLOPs = 5.536 µs (above the launch
//     and the 1.3 µs of bytes): 16.6 µs unfused; the fused GEMM, 1536
//     wide, is 1×12 tiles, still one wave: 5.536 µs, a third;
//   - backward-weight: a 1536×1024 output over K = 128 rows is 96 tiles,
//     one wave of 0.69 µs, moving 3.8 MB (1.9 µs): the launch, 5 µs, where
//     the three GEMMs take 15 µs: two launches saved.
func TestFusedQKV(t *testing.T) {
	cfg := &moe.Config{Hidden: 1024, Heads: 8, KVHeads: 2, HeadDim: 128}
	rows := int64(128)
	count := func(op moe.Op) int64 {
		out, in, _ := weightShape(cfg, op)
		return rows * out * in
	}
	sum := func(s ComputeSpec, pass moe.Pass) float64 {
		var sec float64
		for _, op := range []moe.Op{moe.OpQProj, moe.OpKProj, moe.OpVProj} {
			v, err := s.OpSeconds(cfg, moe.OpRecord{Op: op, Pass: pass, Count: count(op)}, 1, nil)
			if err != nil {
				t.Fatal(err)
			}
			sec += v
		}
		return sec
	}
	wave := 132 * 2 * 128 * 128 * 1024.0 / 800e12
	fused := testSpec
	fused.FusedQKV = true
	for _, c := range []struct {
		name              string
		pass              moe.Pass
		unfused, fusedSec float64
	}{
		{"forward", moe.Forward, 3 * wave, wave},
		{"backward-weight", moe.BackwardWeight, 3 * 5e-6, 5e-6},
	} {
		if got := sum(testSpec, c.pass); !near(got, c.unfused, 1e-12) {
			t.Errorf("%s unfused: %g s, want %g", c.name, got, c.unfused)
		}
		if got := sum(fused, c.pass); !near(got, c.fusedSec, 1e-12) {
			t.Errorf("%s fused: %g s, want %g", c.name, got, c.fusedSec)
		}
	}
}
