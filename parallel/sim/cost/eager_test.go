package cost

import (
	"testing"

	"github.com/moescope/moescope/moe"
)

// TestEagerKernelBytes prices eager elementwise records from the kernels
// each runs, counted by hand from the code that runs (eagerBytes' table):
// 1e9 elements at testSpec's 4 TB/s × 0.5 = 2e12 B/s take 0.5 ms per byte
// per element.
func TestEagerKernelBytes(t *testing.T) {
	cfg := &moe.Config{Hidden: 1024, Heads: 8, KVHeads: 2, HeadDim: 128, Vocab: 1000}
	perByte := 1e9 / 2e12
	cases := []struct {
		name      string
		op        moe.Op
		pass      moe.Pass
		composite bool
		compiled  bool
		bytes     float64
	}{
		// to(float) 2+4, pow 4+4, mean 4, × rsqrt 4+4, × weight 4+4, type_as 4+2.
		{"composite norm forward", moe.OpAttnNorm, moe.Forward, true, false, 40},
		{"composite norm recompute", moe.OpFFNNorm, moe.Recompute, true, false, 40},
		{"composite norm dX", moe.OpQNorm, moe.BackwardData, true, false, 64},
		{"composite norm dW", moe.OpFinalNorm, moe.BackwardWeight, true, false, 16},
		// One fused kernel each way: bf16 read + write forward, 3 accesses per backward record.
		{"fused norm forward", moe.OpAttnNorm, moe.Forward, false, false, 6},
		{"fused norm dX", moe.OpAttnNorm, moe.BackwardData, false, false, 8},
		// float() 2+4, complex multiply 4+4, type_as 4+2, each way.
		{"rope forward", moe.OpRoPE, moe.Forward, false, false, 20},
		{"rope backward", moe.OpRoPE, moe.BackwardData, true, false, 20},
		// silu 2+2, mul 2+2+2; backward two muls 6+6 and silu's 6.
		{"swiglu forward", moe.OpDenseAct, moe.Forward, false, false, 10},
		{"expert swiglu backward", moe.OpExpertAct, moe.BackwardData, false, false, 18},
		// float() 2+4, log_softmax 4+4; backward zero fill 4, log_softmax backward 12, cast 4+2.
		{"loss forward", moe.OpLoss, moe.Forward, false, false, 14},
		{"loss backward", moe.OpLoss, moe.BackwardData, false, false, 22},
		// Compiled, Inductor's fused chain: the eager table does not apply.
		{"compiled composite norm", moe.OpAttnNorm, moe.Forward, true, true, 4},
		{"compiled loss backward", moe.OpLoss, moe.BackwardData, false, true, 12},
		{"compiled rope", moe.OpRoPE, moe.Forward, false, true, 4},
		// Residual adds are one kernel each: read two, write one.
		{"eager residual", moe.OpResidual, moe.Forward, true, false, 6},
	}
	for _, c := range cases {
		s := testSpec
		s.LaunchS = 0
		s.CompositeNorm, s.Compiled = c.composite, c.compiled
		rec := moe.OpRecord{Op: c.op, Pass: c.pass, Count: 1e9}
		if got, want := opSeconds(t, s, cfg, rec, 1), c.bytes*perByte; !near(got, want, 1e-12) {
			t.Errorf("%s: %g s, want %g s (%g bytes per element)", c.name, got, want, c.bytes)
		}
	}
}
