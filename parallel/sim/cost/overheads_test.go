package cost

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/parallel"
)

// FSDPCopySeconds' bytes, worked by hand for E = 1024 elements over 4
// ranks (shard 256) on a 1 TB/s device: the gather's copy-in casts the
// shard from the parameter type into bf16 (f32: 6 B, bf16 parameters: 4
// B per shard element) and its copy-out reads and writes the gathered bf16
// buffer (4 B per element); the reduce-scatter's copy-in casts bf16
// gradients into the reduce type (f32: 6 B, bf16: 4 B per element) and
// its copy-out reads the reduced shard and reads and writes the sharded
// gradient (f32 everywhere: 12 B; bf16 reduce, f32 gradient: 10 B).
func TestFSDPCopySeconds(t *testing.T) {
	spec := ComputeSpec{HBMBytesPerS: 1e12, MemEff: 1}
	const e, shard = 1024.0, 256.0
	bf16Params := moe.DefaultPrecision
	bf16Params.Param = moe.BF16
	for _, c := range []struct {
		name                string
		o                   parallel.ScheduleOp
		prec                moe.Precision
		onStream, onCompute float64
	}{
		{"gather f32 params", parallel.ScheduleOp{Purpose: parallel.PurposeGather, Coll: parallel.CollAllGather, DType: moe.BF16, Elements: 1024}, moe.Precision{}, 6 * shard, 4 * e},
		{"gather bf16 params", parallel.ScheduleOp{Purpose: parallel.PurposeGather, Coll: parallel.CollAllGather, DType: moe.BF16, Elements: 1024}, bf16Params, 4 * shard, 4 * e},
		{"reduce-scatter f32", parallel.ScheduleOp{Purpose: parallel.PurposeGradReduce, Coll: parallel.CollReduceScatter, DType: moe.F32, Elements: 1024}, moe.DefaultPrecision, 12 * shard, 6 * e},
		{"reduce-scatter bf16", parallel.ScheduleOp{Purpose: parallel.PurposeGradReduce, Coll: parallel.CollReduceScatter, DType: moe.BF16, Elements: 1024}, moe.DefaultPrecision, 10 * shard, 4 * e},
		{"replica all-reduce", parallel.ScheduleOp{Purpose: parallel.PurposeGradReplica, Coll: parallel.CollAllReduce, DType: moe.F32, Elements: 1024}, moe.DefaultPrecision, 0, 0},
	} {
		s, comp := spec.FSDPCopySeconds(c.o, 4, c.prec)
		if !near(s, c.onStream/1e12, 1e-12) || !near(comp, c.onCompute/1e12, 1e-12) {
			t.Errorf("%s: %g s on its stream and %g s on compute, want %g and %g", c.name, s, comp, c.onStream/1e12, c.onCompute/1e12)
		}
	}
}
