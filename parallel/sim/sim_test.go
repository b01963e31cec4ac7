package sim

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/sim/cost"
)

// near reports a and b equal within rel of the larger (cost's tests have
// their own).
func near(a, b, rel float64) bool { return math.Abs(a-b) <= rel*math.Max(math.Abs(a), math.Abs(b)) }

func simTestInput(t testing.TB, model string, gpus, ep, lbs, seq, accum int, ac string) Input {
	t.Helper()
	cfg, err := hf.Load(model)
	if err != nil {
		t.Fatal(err)
	}
	l := job.Layout{GPUs: gpus, EP: ep, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	a, err := moe.ParseAC(ac)
	if err != nil {
		t.Fatal(err)
	}
	return Input{Spec: job.Spec{Model: cfg, Layout: l, AC: a, Batch: job.Batch{LBS: lbs, Seq: seq, GradAccum: accum}, Recipe: job.EagerRecipe()}}
}

// The breakdown partitions the step; TPS is tokens over step time; the
// memory peak is the memory package's own, exactly.
func TestSimulateInvariants(t *testing.T) {
	for _, in := range []Input{
		simTestInput(t, "tiny", 16, 2, 2, 64, 1, "selective"),
		simTestInput(t, "tiny", 8, 4, 1, 128, 3, "full"),
		simTestInput(t, "tiny", 8, 4, 1, 128, 2, "modules:layernorm,moe"),
		simTestInput(t, "tiny-dense", 4, 1, 2, 64, 2, "none"),
		gradSyncLastOnly(simTestInput(t, "tiny", 8, 4, 1, 128, 3, "full")),
	} {
		r, err := Simulate(in)
		if err != nil {
			t.Fatal(err)
		}
		b := r.Breakdown
		sum := b.ComputeS + b.RecomputeS + b.OptimizerS
		for _, v := range b.ExposedCommS {
			sum += v
		}
		if !near(sum, r.StepTimeS, 1e-9) {
			t.Errorf("breakdown sums to %g, step time %g: %+v", sum, r.StepTimeS, b)
		}
		tokens := float64(in.LBS * in.Seq * max(1, in.GradAccum))
		if !near(r.TPS, tokens/r.StepTimeS, 1e-12) {
			t.Errorf("tps %g ≠ tokens/step %g", r.TPS, tokens/r.StepTimeS)
		}
		rep, err := memory.Estimate(in.Model, in.Layout, memory.Batch{LBS: in.LBS, Seq: in.Seq, GradAccum: in.GradAccum}, memory.Options{AC: in.AC})
		if err != nil {
			t.Fatal(err)
		}
		if r.PeakReservedBytes != rep.Peak.Reserved || r.PeakAllocatedBytes != rep.Peak.Allocated {
			t.Errorf("memory peak %d/%d, memory package %d/%d", r.PeakAllocatedBytes, r.PeakReservedBytes, rep.Peak.Allocated, rep.Peak.Reserved)
		}
		if in.AC.Mode == moe.ACFull && b.RecomputeS <= 0 {
			t.Errorf("full AC without recompute time: %+v", b)
		}
		if r.MFU <= 0 || r.MFU > 1 || r.HFU < r.MFUByConvention["model"] {
			t.Errorf("mfu %g hfu %g model %g", r.MFU, r.HFU, r.MFUByConvention["model"])
		}
	}
}

func gradSyncLastOnly(in Input) Input {
	in.Layout.GradSyncLastOnly = true
	return in
}

// TestSimulateGradSyncLastOnly: deferring the gradient reductions of
// grad-accum 3 to the last micro-step runs a third of the reduce-scatters
// (the same ones, once), so their total time is a third (within 1%: the
// modelled contention of a collective depends on what overlaps it, which
// differs between micro-steps), and the step is not slower.
func TestSimulateGradSyncLastOnly(t *testing.T) {
	in := simTestInput(t, "tiny", 8, 4, 1, 128, 3, "selective")
	every, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	last, err := Simulate(gradSyncLastOnly(in))
	if err != nil {
		t.Fatal(err)
	}
	e, l := every.Breakdown.CommS["reduce_scatter"], last.Breakdown.CommS["reduce_scatter"]
	if !(e > 0) || !near(l, e/3, 1e-2) {
		t.Errorf("reduce-scatter time %g s with grad-sync-last-only, %g s without: want a third", l, e)
	}
	if last.StepTimeS > every.StepTimeS {
		t.Errorf("step %g s with grad-sync-last-only, %g s without: fewer collectives made it slower", last.StepTimeS, every.StepTimeS)
	}
}

// Expert skew slows the step: the most loaded EP rank does more grouped
// GEMM work and moves more all-to-all bytes.
func TestSimulateSkew(t *testing.T) {
	in := simTestInput(t, "tiny", 8, 4, 4, 128, 1, "none")
	base, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	in.ExpertSkew = 2
	skew, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	if !(skew.StepTimeS > base.StepTimeS) {
		t.Errorf("skew 2: step %g not above balanced %g", skew.StepTimeS, base.StepTimeS)
	}
	// Counts equal for every expert are the balanced case.
	in.ExpertSkew = 0
	in.ExpertCounts = [][]int64{{256, 256, 256, 256}}
	even, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	if !near(even.StepTimeS, base.StepTimeS, 1e-12) {
		t.Errorf("even counts: %g, balanced %g", even.StepTimeS, base.StepTimeS)
	}
}

func TestSimulateBadInput(t *testing.T) {
	in := simTestInput(t, "tiny", 2, 1, 1, 64, 1, "none")
	in.LBS = 0
	if _, err := Simulate(in); err == nil {
		t.Error("lbs 0 accepted")
	}
	in.LBS, in.ExpertSkew = 1, 0.5
	if _, err := Simulate(in); err == nil {
		t.Error("skew 0.5 accepted")
	}
	// The largest skew, by hand for tiny (E = 4 experts, K = 2): a token
	// sends at most min(K, E/ep) rows to one EP rank, of a mean of K/ep, so
	// skew ≤ ep·min(K, E/ep)/K: ep 4 → 4·1/2 = 2, ep 2 → 2·2/2 = 2, ep 1
	// → 1 (one rank always holds the mean).
	for _, c := range []struct {
		gpus, ep int
		max      float64
	}{{8, 4, 2}, {8, 2, 2}, {2, 1, 1}} {
		in := simTestInput(t, "tiny", c.gpus, c.ep, 1, 64, 1, "none")
		if c.max > 1 {
			in.ExpertSkew = c.max
			if _, err := Simulate(in); err != nil {
				t.Errorf("ep %d: skew %v (the largest) refused: %v", c.ep, c.max, err)
			}
		}
		in.ExpertSkew = c.max + 0.01
		if _, err := Simulate(in); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("must be in [1, %v]", c.max)) {
			t.Errorf("ep %d: skew %v: err = %v, want one naming [1, %v]", c.ep, in.ExpertSkew, err, c.max)
		}
	}
}

// One GPU runs no collective: the step is exactly the sum of its compute
// ops, and nothing is exposed.
func TestSimulateOneGPUIsSumOfCompute(t *testing.T) {
	in := simTestInput(t, "tiny", 1, 1, 2, 64, 2, "full")
	in.KeepTimeline = true
	r, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for i, o := range r.Schedule.Ops {
		if o.Type != parallel.OpCompute {
			t.Fatalf("op %d is a collective on one GPU: %s", i, o)
		}
		sum += r.spans[i].end - r.spans[i].start
	}
	if !near(sum, r.StepTimeS, 1e-12) {
		t.Errorf("step %g, Σ compute %g", r.StepTimeS, sum)
	}
	for k, v := range r.Breakdown.ExposedCommS {
		if v != 0 {
			t.Errorf("exposed %s = %g on one GPU", k, v)
		}
	}
}

// Large worlds simulate (one rank stands for all) and larger data-parallel
// groups cost more step time, never less.
func TestSimulateLargeWorld(t *testing.T) {
	var prev float64
	for _, g := range []int{8, 512, 4096} {
		in := simTestInput(t, "tiny", g, 4, 1, 128, 1, "selective")
		r, err := Simulate(in)
		if err != nil {
			t.Fatalf("%d GPUs: %v", g, err)
		}
		if r.StepTimeS < prev {
			t.Errorf("%d GPUs: step %g below the smaller world's %g", g, r.StepTimeS, prev)
		}
		prev = r.StepTimeS
	}
}

// HSDP with accumulation: skipping the replica all-reduce on all but the
// last micro-step moves fewer bytes and does not make the step slower
// (beyond 1e-4: greedy stream scheduling with shared links can shift
// timings by list-scheduling effects).
func TestSimulateAllreduceLastOnly(t *testing.T) {
	in := simTestInput(t, "tiny", 32, 1, 1, 64, 4, "none")
	in.Layout = job.Layout{GPUs: 32, DPShard: 8, DPReplicate: 4, EP: 1, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	every, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	in.Layout.AllreduceLastOnly = true
	last, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	if last.StepTimeS > every.StepTimeS*(1+1e-4) || last.Breakdown.CommS["all_reduce"] >= every.Breakdown.CommS["all_reduce"] {
		t.Errorf("allreduce-last-only: step %g (all-reduce %g) vs every micro-step %g (%g)",
			last.StepTimeS, last.Breakdown.CommS["all_reduce"], every.StepTimeS, every.Breakdown.CommS["all_reduce"])
	}
}

// FuzzSimulateCounts: any per-expert counts either are rejected or give a
// finite positive step whose breakdown sums to it.
func FuzzSimulateCounts(f *testing.F) {
	f.Add(int64(256), int64(256), int64(256), int64(256), 1.0)
	f.Add(int64(0), int64(0), int64(0), int64(1024), 0.0)
	f.Add(int64(0), int64(0), int64(0), int64(0), 3.0)
	base := simTestInput(f, "tiny", 8, 4, 2, 64, 1, "selective")
	f.Fuzz(func(t *testing.T, a, b, c, d int64, skew float64) {
		in := base
		if a > 1<<30 || b > 1<<30 || c > 1<<30 || d > 1<<30 {
			return
		}
		in.ExpertCounts = [][]int64{{a, b, c, d}}
		in.ExpertSkew = skew
		r, err := Simulate(in)
		if err != nil {
			return
		}
		sum := r.Breakdown.ComputeS + r.Breakdown.RecomputeS + r.Breakdown.OptimizerS
		for _, v := range r.Breakdown.ExposedCommS {
			sum += v
		}
		if !(r.StepTimeS > 0) || math.IsInf(r.StepTimeS, 0) || !near(sum, r.StepTimeS, 1e-9) {
			t.Fatalf("counts %v skew %v: step %g, breakdown sum %g", in.ExpertCounts, skew, r.StepTimeS, sum)
		}
	})
}

// Compute by op class adds up to compute + recompute.
func TestSimulateComputeByClass(t *testing.T) {
	r, err := Simulate(simTestInput(t, "tiny", 8, 2, 2, 128, 2, "full"))
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, v := range r.Breakdown.ComputeByClassS {
		sum += v
	}
	// Compute also holds the time NCCL's kernels took from it.
	sum += r.Breakdown.OverheadS[OverheadNCCLContention]
	if want := r.Breakdown.ComputeS + r.Breakdown.RecomputeS; !near(sum, want, 1e-9) {
		t.Errorf("by class %v sums to %g, compute + recompute %g", r.Breakdown.ComputeByClassS, sum, want)
	}
	for _, c := range cost.OpClasses() {
		if r.Breakdown.ComputeByClassS[c.String()] <= 0 {
			t.Errorf("no %s time: %v", c, r.Breakdown.ComputeByClassS)
		}
	}
}

// SingleCommStream runs the schedule's streams literally: every collective
// on one stream, so no two collectives overlap.
func TestSimulateSingleCommStream(t *testing.T) {
	in := simTestInput(t, "tiny", 8, 2, 2, 64, 2, "none")
	in.SingleCommStream, in.KeepTimeline = true, true
	r, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	var prevEnd float64
	for i, o := range r.Schedule.Ops {
		if o.Type != parallel.OpCollective {
			continue
		}
		if r.streams[i] != simGather {
			t.Fatalf("op %d on stream %s", i, r.streams[i])
		}
		if r.spans[i].start < prevEnd-1e-15 {
			t.Fatalf("collective %d starts at %g before the previous ends at %g", i, r.spans[i].start, prevEnd)
		}
		prevEnd = r.spans[i].end
	}
}

// The virtual-time schedule moves the run's own types, as its memory
// timeline holds them: with reduce_dtype bf16 every gradient
// reduce-scatter carries 2 bytes per element instead of f32's 4, so its
// bytes halve (same elements), and the step is no slower.
func TestSimulateReduceDType(t *testing.T) {
	in := simTestInput(t, "tiny", 8, 1, 2, 128, 1, "selective")
	rsBytes := func(r Result) (n int, bytes int64, dt moe.DType) {
		for _, o := range r.Schedule.Ops {
			if o.Type == parallel.OpCollective && o.Purpose == parallel.PurposeGradReduce && o.Coll == parallel.CollReduceScatter {
				n++
				bytes += o.Bytes()
				dt = o.DType
			}
		}
		return n, bytes, dt
	}
	var got [2]int64
	var steps [2]float64
	for i, dt := range []moe.DType{moe.F32, moe.BF16} {
		c := in
		c.ReduceDType = dt
		r, err := Simulate(c)
		if err != nil {
			t.Fatal(err)
		}
		n, b, typ := rsBytes(r)
		if n == 0 || typ != dt {
			t.Fatalf("reduce_dtype %s: %d reduce-scatters, last in %s", dt, n, typ)
		}
		got[i], steps[i] = b, r.StepTimeS
	}
	if got[1]*2 != got[0] {
		t.Errorf("reduce-scatter bytes %d (bf16) vs %d (f32): want exactly half", got[1], got[0])
	}
	if steps[1] > steps[0] {
		t.Errorf("step %g s with bf16 reduction, %g s with f32: halving the bytes made it slower", steps[1], steps[0])
	}
}

// FSDP2 runs part of its copies on the compute stream
// (cost.ComputeSpec.FSDPCopySeconds): an all-gather's copy-out in the
// unit's unshard wait, charged to the first compute op that waits for the
// gather, and a reduce-scatter's copy-in in the post-backward hook,
// charged to the compute op it follows
// (through a tensor-parallel all-reduce between them); a copy with no such
// compute op stays on its collective. Worked by hand on a five-op program.
func TestChargeComputeCopies(t *testing.T) {
	s := &parallel.Schedule{Ops: []parallel.ScheduleOp{
		{Type: parallel.OpCollective, Coll: parallel.CollAllGather, Purpose: parallel.PurposeGather},                         // 0
		{Type: parallel.OpCompute, Deps: []int{0}},                                                                           // 1: waits for the gather
		{Type: parallel.OpCollective, Coll: parallel.CollAllReduce, Axis: parallel.AxisTP, Deps: []int{1}},                   // 2: tp grad sync
		{Type: parallel.OpCollective, Coll: parallel.CollReduceScatter, Purpose: parallel.PurposeGradReduce, Deps: []int{2}}, // 3
		{Type: parallel.OpCollective, Coll: parallel.CollAllGather, Purpose: parallel.PurposeGather},                         // 4: no consumer
	}}
	sim := &simulated{ops: make([]simOp, 5), comm: make([]cost.Comm, 5), byClass: make([][cost.NumOpClasses]float64, 5)}
	sim.ops[1].compute = 1
	sim.chargeComputeCopies(s, []computeCopy{{0, 0.25}, {3, 0.5}, {4, 2}})
	if got := sim.ops[1].compute; got != 1.75 {
		t.Errorf("compute op: %g s, want 1 + 0.25 (gather copy-out) + 0.5 (reduce-scatter copy-in)", got)
	}
	if got := sim.byClass[1][cost.ClassMemoryBound]; got != 0.75 {
		t.Errorf("compute op's memory-bound share %g s, want 0.75", got)
	}
	if sim.ops[4].lat != 2 || sim.comm[4].LatencyS != 2 {
		t.Errorf("unconsumed gather: latency %g / %g s, want its copy (2 s) on the collective", sim.ops[4].lat, sim.comm[4].LatencyS)
	}
	if sim.ops[0].lat != 0 || sim.ops[3].lat != 0 {
		t.Errorf("collectives whose copies moved to compute kept latency %g, %g", sim.ops[0].lat, sim.ops[3].lat)
	}
}

// Under HSDP the replicas' gradient all-reduce runs on a stream of its
// own, after its unit's reduce-scatter, as FSDP2's all_reduce_stream does
// (foreach_reduce): the next unit's reduce-scatter never queues behind it.
func TestSimulateReplicaAllReduceStream(t *testing.T) {
	in := simTestInput(t, "tiny", 8, 1, 2, 128, 1, "none")
	in.Layout = job.Layout{GPUs: 8, DPReplicate: 2, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	if err := in.Layout.Resolve(); err != nil {
		t.Fatal(err)
	}
	in.KeepTimeline = true
	r, err := Simulate(in)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i, o := range r.Schedule.Ops {
		if o.Type != parallel.OpCollective {
			continue
		}
		want := simReduce
		switch {
		case o.Purpose == parallel.PurposeGradReplica:
			want = simAllReduce
			n++
			if len(o.Deps) != 1 || r.Schedule.Ops[o.Deps[0]].Purpose != parallel.PurposeGradReduce {
				t.Errorf("op %d: replica all-reduce after %v, want after its unit's reduce-scatter", i, o.Deps)
			} else if r.spans[i].start < r.spans[o.Deps[0]].end-1e-15 {
				t.Errorf("op %d: all-reduce starts at %g before its reduce-scatter ends at %g", i, r.spans[i].start, r.spans[o.Deps[0]].end)
			}
		case o.Purpose == parallel.PurposeGather, o.Purpose == parallel.PurposeRegather:
			want = simGather
		case o.Purpose != parallel.PurposeGradReduce:
			continue
		}
		if r.streams[i] != want {
			t.Errorf("op %d (%s %s) on stream %s, want %s", i, o.Purpose, o.Coll, r.streams[i], want)
		}
	}
	if n == 0 {
		t.Fatal("no replica all-reduce in an HSDP schedule")
	}
}
