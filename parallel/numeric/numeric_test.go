package numeric

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
	"github.com/moescope/moescope/parallel/numeric/collective"
)

// numericRun trains steps optimizer steps of cfg under layout l and returns
// the per-step losses and the final parameters.
func numericRun(t *testing.T, cfg *moe.Config, l job.Layout, ac moe.AC, lbs, micro, steps int) ([]StepResult, [][]float32, *Trainer) {
	t.Helper()
	return numericRunSeq(t, cfg, l, ac, lbs, 4, micro, steps)
}

// numericRunSeq is numericRun on sequences of seq tokens.
func numericRunSeq(t *testing.T, cfg *moe.Config, l job.Layout, ac moe.AC, lbs, seq, micro, steps int) ([]StepResult, [][]float32, *Trainer) {
	t.Helper()
	m, err := parallel.NewMesh(l, cfg, 4)
	if err != nil {
		t.Fatal(err)
	}
	init, err := ref.NewModel[float32](cfg)
	if err != nil {
		t.Fatal(err)
	}
	init.InitRandom(7)
	spec := Spec{Spec: job.Spec{Model: cfg, AC: ac, Batch: job.Batch{LBS: lbs, Seq: seq, GradAccum: micro}}, Mesh: m, DataSeed: 11, AdamW: ref.AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}, AuxCoef: cfg.AuxLossCoef, BiasRate: 1e-3}
	n, err := New(spec, init.Tensors())
	if err != nil {
		t.Fatal(err)
	}
	var res []StepResult
	for s := 0; s < steps; s++ {
		r, err := n.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		res = append(res, r)
	}
	return res, n.Params(), n
}

// compareRuns checks losses and parameters of run b against reference a:
// bitwise when exact, else within tol relative (per tensor, max |Δ| over
// max |a|).
func compareRuns(t *testing.T, name string, a, b []StepResult, pa, pb [][]float32, exact bool, tol float64) {
	t.Helper()
	for s := range a {
		if len(a[s].Losses) != len(b[s].Losses) {
			t.Fatalf("%s step %d: %d vs %d micro-batch losses", name, s, len(a[s].Losses), len(b[s].Losses))
		}
		for i := range a[s].Losses {
			x, y := a[s].Losses[i], b[s].Losses[i]
			if exact && x != y || math.Abs(x-y) > tol*math.Abs(x) {
				t.Errorf("%s step %d micro-batch %d: loss %.9g, one rank %.9g", name, s, i, y, x)
			}
		}
		if exact && a[s].Aux != b[s].Aux || math.Abs(a[s].Aux-b[s].Aux) > tol*math.Abs(a[s].Aux)+1e-12 {
			t.Errorf("%s step %d: aux %.9g, one rank %.9g", name, s, b[s].Aux, a[s].Aux)
		}
	}
	for i := range pa {
		var d, s float64
		for j := range pa[i] {
			d = math.Max(d, math.Abs(float64(pa[i][j]-pb[i][j])))
			s = math.Max(s, math.Abs(float64(pa[i][j])))
		}
		if exact && d != 0 || d > tol*s {
			t.Errorf("%s: parameter %d differs by %g (max |p| %g)", name, i, d, s)
			return
		}
	}
}

// TestNumericEqualsOneRank: N ranks at lbs l with grad-accum A produce the
// losses and parameters of one rank at lbs l with grad-accum DP·A (the same
// micro-batches, DESIGN.md Batch contract), after several steps, for every
// mesh of the issue, ep ∈ {1, 2, 4}, every sharding mode, checkpointing
// policy and FSDP option, aux loss on.
//
// Bit for bit where the reduction order is one rank's: a single replica
// without expert parallelism (every gradient is summed as
// ((acc + g_{m,0}) + g_{m,1}) + … , the order in which one rank accumulates
// its micro-batches). Within 1e-5 relative otherwise: HSDP sums replicas'
// partial sums, and expert parallelism runs one expert GEMM over the tokens
// of several micro-batches at once.
func TestNumericEqualsOneRank(t *testing.T) {
	cfg := moetest.TinyMoE()
	acs := []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}, {Mode: moe.ACLayer, Every: 2}}
	shardings := []job.Sharding{job.ShardFSDP, job.ShardZeRO2, job.ShardZeRO1, job.ShardDDP}
	type mesh struct{ gpus, rep, ep int }
	meshes := []mesh{{1, 1, 1}, {2, 1, 1}, {2, 1, 2}, {4, 1, 1}, {4, 1, 2}, {4, 1, 4}, {4, 2, 1}, {4, 2, 2}, {8, 1, 1}, {8, 1, 2}, {8, 1, 4}}
	const steps = 3
	type refKey struct {
		ac    string
		micro int
	}
	refs := map[refKey]struct {
		r []StepResult
		p [][]float32
	}{}
	single := func(ac moe.AC, micro int) ([]StepResult, [][]float32) {
		k := refKey{ac.String(), micro}
		if v, ok := refs[k]; ok {
			return v.r, v.p
		}
		r, p, _ := numericRun(t, cfg, moetest.FSDPLayout(t, 1, 1, 1), ac, 1, micro, steps)
		refs[k] = struct {
			r []StepResult
			p [][]float32
		}{r, p}
		return r, p
	}
	// Per mesh k, every sharding mode once, rotated against the policies
	// and accumulation so that across meshes every mode meets every policy
	// with and without accumulation.
	i := 0
	for k, ms := range meshes {
		for j := range shardings {
			sh := shardings[(j+k)%len(shardings)]
			ac := acs[j]
			accum := 1 + (j+k/len(shardings))%2
			i++
			l := moetest.FSDPLayout(t, ms.gpus, ms.rep, ms.ep)
			l.Sharding = sh
			switch i % 3 { // FSDP options spread over the matrix
			case 1:
				l.ReshardAfterForward = false
			case 2:
				l.KeepGathered = true
				l.AllreduceLastOnly = true
			}
			name := fmt.Sprintf("gpus %d rep %d ep %d %s ac %s accum %d ra %v keep %v last-only %v",
				ms.gpus, ms.rep, ms.ep, sh, ac, accum, l.ReshardAfterForward, l.KeepGathered, l.AllreduceLastOnly)
			ra, pa := single(ac, accum*l.DP())
			rb, pb, _ := numericRun(t, cfg, l, ac, 1, accum, steps)
			exact := ms.rep == 1 && ms.ep == 1
			compareRuns(t, name, ra, rb, pa, pb, exact, 1e-5)
		}
	}
	// Every policy with and without accumulation on HSDP × EP.
	for _, ac := range acs {
		for accum := 1; accum <= 2; accum++ {
			l := moetest.FSDPLayout(t, 4, 2, 2)
			ra, pa := single(ac, accum*4)
			rb, pb, _ := numericRun(t, cfg, l, ac, 1, accum, steps)
			compareRuns(t, fmt.Sprintf("2×2 ep 2 ac %s accum %d", ac, accum), ra, rb, pa, pb, false, 1e-5)
		}
	}
}

// TestNumericMatchesReference: one numeric rank equals ref.Model (the
// reference implementation's own ForwardBackward, Accumulate and Step) on
// the same micro-batches within 1e-5 relative (different head code and
// expert-gradient accumulation order; same formulas).
func TestNumericMatchesReference(t *testing.T) {
	cfg := moetest.TinyMoE()
	ac := moe.AC{Mode: moe.ACSelective}
	const micro, steps = 2, 3
	res, params, n := numericRun(t, cfg, moetest.FSDPLayout(t, 1, 1, 1), ac, 2, micro, steps)
	model, err := ref.NewModel[float32](cfg)
	if err != nil {
		t.Fatal(err)
	}
	model.InitRandom(7)
	b := n.spec.data()
	for s := 0; s < steps; s++ {
		var mbs [][][]int
		for m := 0; m < micro; m++ {
			var mb [][]int
			for _, seq := range b.Sequences(n.spec.DataSeed, cfg.Vocab, s, m, 0) {
				ids := make([]int, len(seq))
				for j, v := range seq {
					ids[j] = int(v)
				}
				mb = append(mb, ids)
			}
			mbs = append(mbs, mb)
		}
		r, err := model.Accumulate(mbs, ref.Options{AC: ac, AuxCoef: cfg.AuxLossCoef})
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(r.Loss-res[s].Loss) > 1e-5*math.Abs(r.Loss) || math.Abs(r.Aux-res[s].Aux) > 1e-5*math.Abs(r.Aux) {
			t.Errorf("step %d: numeric loss %.9g aux %.9g, ref.Model %.9g %.9g", s, res[s].Loss, res[s].Aux, r.Loss, r.Aux)
		}
		model.Step(n.spec.AdamW)
	}
	for i, p := range model.Tensors() {
		var d, m float64
		for j := range p {
			d = math.Max(d, math.Abs(float64(p[j]-params[i][j])))
			m = math.Max(m, math.Abs(float64(p[j])))
		}
		if d > 1e-5*m {
			t.Errorf("%s: numeric and ref.Model differ by %g (max |p| %g)", cfg.Params()[i].Name, d, m)
		}
	}
}

// TestNumericFollowsSchedule: every rank of a numeric step issues exactly
// the collectives of BuildSchedule's program for the layout — same kinds,
// groups, dtypes and sizes, in the same order (all-to-all sizes are exact:
// a rank sends all its T·K rows, its own included). Both walk the step's
// order (job.StepOrder), whose FSDP2 variants the last cases cover: a tied
// embedding, keep-gathered without resharding, the last-only options
// (parallel/crosscheck checks memory and the schedule against the order).
// Megatron-FSDP is not among them: the numeric ranks issue FSDP2's
// collectives in FSDP2's order (a layer's experts gathered apart, the
// head's gradients reduced after its backward), not Megatron's.
func TestNumericFollowsSchedule(t *testing.T) {
	cases := []struct {
		gpus, rep, ep int
		sh            job.Sharding
		ac            moe.AC
		micro         int
		keep, last    bool
		// the order's variants: no reshard after forward, a tied embedding
		noReshard, tied bool
	}{
		{4, 1, 2, job.ShardFSDP, moe.AC{Mode: moe.ACFull}, 2, false, false, false, false},
		{4, 2, 2, job.ShardFSDP, moe.AC{Mode: moe.ACSelective}, 2, true, true, false, false},
		{4, 2, 1, job.ShardZeRO2, moe.AC{Mode: moe.ACNone}, 1, false, false, false, false},
		{8, 1, 4, job.ShardZeRO1, moe.AC{Mode: moe.ACLayer, Every: 2}, 2, false, false, false, false},
		{2, 2, 1, job.ShardDDP, moe.AC{Mode: moe.ACSelective}, 3, false, true, false, false},
		// Megatron's moe module re-runs the MoE layer's all-to-alls.
		{4, 1, 2, job.ShardFSDP, moe.AC{Mode: moe.ACModules, Modules: moe.RecomputeMoE}, 2, false, false, false, false},
		{4, 2, 2, job.ShardZeRO1, moe.AC{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoE}, 2, true, false, false, false},
		{4, 2, 2, job.ShardFSDP, moe.AC{Mode: moe.ACFull}, 3, true, false, true, true},
		{4, 2, 2, job.ShardFSDP, moe.AC{Mode: moe.ACSelective}, 2, false, true, false, true},
	}
	for _, tc := range cases {
		cfg := moetest.TinyMoE()
		cfg.TiedEmbeddings = tc.tied
		l := moetest.FSDPLayout(t, tc.gpus, tc.rep, tc.ep)
		l.Sharding, l.KeepGathered, l.AllreduceLastOnly = tc.sh, tc.keep, tc.last
		l.ReshardAfterForward = !tc.noReshard
		name := fmt.Sprintf("%d×%d ep %d %s %s micro %d", tc.rep, tc.gpus/tc.rep, tc.ep, tc.sh, tc.ac, tc.micro)
		m, err := parallel.NewMesh(l, cfg, 4)
		if err != nil {
			t.Fatal(err)
		}
		s, err := parallel.BuildSchedule(parallel.ScheduleSpec{Spec: job.Spec{Model: cfg, AC: tc.ac, Batch: job.Batch{LBS: 1, Seq: 4, GradAccum: tc.micro}, Recipe: job.EagerRecipe()}, Mesh: m})
		if err != nil {
			t.Fatal(err)
		}
		var want []collective.Record
		for _, o := range s.Ops {
			if o.Type == parallel.OpCollective {
				want = append(want, collective.Record{Kind: o.Coll, Axis: o.Axis, DType: o.DType, Elements: o.Elements})
			}
		}
		init, _ := ref.NewModel[float32](cfg)
		init.InitRandom(3)
		n, err := New(Spec{Spec: job.Spec{Model: cfg, AC: tc.ac, Batch: job.Batch{LBS: 1, Seq: 4, GradAccum: tc.micro}}, Mesh: m, AdamW: ref.DefaultAdamW, AuxCoef: cfg.AuxLossCoef}, init.Tensors())
		if err != nil {
			t.Fatal(err)
		}
		n.Comm().Trace = true
		res, err := n.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// Sized by the recorded routing, the schedule predicts every rank's
		// all-to-alls exactly.
		for r, got := range n.Comm().Traces() {
			sr, err := s.WithCounts(m, r, res.ExpertCounts, cfg.Experts, cfg.Hidden)
			if err != nil {
				t.Fatal(err)
			}
			var w []collective.Record
			for _, o := range sr.Ops {
				if o.Type == parallel.OpCollective {
					w = append(w, collective.Record{Kind: o.Coll, Axis: o.Axis, DType: o.DType, Elements: o.Elements})
				}
			}
			if !reflect.DeepEqual(got, w) {
				t.Errorf("%s rank %d: collectives differ from the schedule sized by the recorded counts", name, r)
			}
		}
		// The schedule sizes all-to-alls for uniform routing (T·K rows out
		// per rank). Dispatch (and the combine gradient) do send exactly
		// that; combine and the dispatch gradient return the rows each
		// rank received, which routing decides, so only their sum over all
		// ranks is fixed (world × T·K rows: every row goes and comes back).
		traces := n.Comm().Traces()
		sum := make([]int64, len(want))
		for r, got := range traces {
			if len(got) != len(want) {
				t.Errorf("%s rank %d: %d collectives, schedule has %d", name, r, len(got), len(want))
				continue
			}
			for i := range got {
				g, w := got[i], want[i]
				sum[i] += g.Elements
				if g.Kind == parallel.CollAllToAll {
					g.Elements, w.Elements = 0, 0
				}
				if g != w {
					t.Errorf("%s rank %d collective %d: ran %+v, schedule says %+v", name, r, i, got[i], want[i])
					break
				}
			}
		}
		for i, w := range want {
			if w.Kind == parallel.CollAllToAll && sum[i] != int64(len(traces))*w.Elements {
				t.Errorf("%s collective %d: all ranks sent %d elements, schedule %d × %d", name, i, sum[i], len(traces), w.Elements)
			}
		}
	}
}

// TestNumericRankFailure kills rank 2 at the start of its second
// micro-step, while the others are in that micro-step's collectives: Step
// returns rank 2's error and every rank returns an error wrapping it (none
// hangs, none finishes).
func TestNumericRankFailure(t *testing.T) {
	n := faultTrainer(t, 4, 2, 2, 2, 0)
	if err := n.SetFault(&Fault{Rank: 2, Step: 0, Micro: 1}); err != nil {
		t.Fatal(err)
	}
	_, err := n.Step(context.Background())
	if !errors.Is(err, ErrInjectedFault) || !strings.Contains(err.Error(), "rank 2: step 1, micro-step 1: injected fault") {
		t.Fatalf("Step = %v, want rank 2's injected failure", err)
	}
	for r, e := range n.RankErrors() {
		if !errors.Is(e, ErrInjectedFault) {
			t.Errorf("rank %d: %v, want the injected failure as its cause", r, e)
		}
	}
}

// TestNumericSelectionBias: a sigmoid router with a selection bias updated
// once per step from loads summed over micro-batches and all-reduced over
// data-parallel ranks (torchtitan's rule) trains as one rank does.
func TestNumericSelectionBias(t *testing.T) {
	cfg := moetest.TinyMoE()
	cfg.Score, cfg.SelectionBias, cfg.RoutedScale = moe.Sigmoid, true, 2.5
	cfg.AuxLossCoef, cfg.OutputRouterLogits = 0, false
	cfg.Groups, cfg.TopKGroups = 2, 1
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	pa := trainsAsOneRank(t, "sigmoid+bias", cfg, []rankCase{{2, 1, 1, 2, true, 1, 1}, {4, 2, 2, 1, false, 1, 1}, {4, 1, 4, 1, false, 1, 1}})
	// The bias moved (else the check above would be vacuous for it).
	for i, p := range cfg.Params() {
		if p.Buffer {
			moved := false
			for _, v := range pa[i] {
				moved = moved || v != 0
			}
			if !moved {
				t.Errorf("%s stayed zero", p.Name)
			}
		}
	}
}

// TestNumericTiedEmbeddings: with tied embeddings the LM head reads the
// embedding's gathered weights (the schedule keeps them gathered from the
// embedding's forward to its backward) and its gradient joins the
// embedding's; training equals one rank.
func TestNumericTiedEmbeddings(t *testing.T) {
	cfg := moetest.TinyMoE()
	cfg.TiedEmbeddings = true
	ac := moe.AC{Mode: moe.ACFull}
	ra, pa, _ := numericRun(t, cfg, moetest.FSDPLayout(t, 1, 1, 1), ac, 1, 4, 3)
	rb, pb, _ := numericRun(t, cfg, moetest.FSDPLayout(t, 4, 1, 1), ac, 1, 1, 3)
	compareRuns(t, "tied 1×4", ra, rb, pa, pb, true, 1e-5)
	rc, pc, n := numericRun(t, cfg, moetest.FSDPLayout(t, 4, 2, 2), ac, 1, 1, 3)
	compareRuns(t, "tied 2×2 ep 2", ra, rc, pa, pc, false, 1e-5)
	// The executed collectives are the schedule's.
	s, err := parallel.BuildSchedule(parallel.ScheduleSpec{Spec: job.Spec{Model: cfg, AC: ac, Batch: job.Batch{LBS: 1, Seq: 4, GradAccum: 1}, Recipe: job.EagerRecipe()}, Mesh: n.spec.Mesh})
	if err != nil {
		t.Fatal(err)
	}
	n.Comm().Trace = true
	res, err := n.Step(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for r, got := range n.Comm().Traces() {
		sr, err := s.WithCounts(n.spec.Mesh, r, res.ExpertCounts, cfg.Experts, cfg.Hidden)
		if err != nil {
			t.Fatal(err)
		}
		var want []collective.Record
		for _, o := range sr.Ops {
			if o.Type == parallel.OpCollective {
				want = append(want, collective.Record{Kind: o.Coll, Axis: o.Axis, DType: o.DType, Elements: o.Elements})
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("rank %d: executed collectives differ from the schedule", r)
		}
	}
}

// TestNumericReproducible: reductions in fixed order make two runs of the
// same layout (goroutines scheduled differently) agree bit for bit, even
// with replicas and expert parallelism.
func TestNumericReproducible(t *testing.T) {
	cfg := moetest.TinyMoE()
	l := moetest.FSDPLayout(t, 8, 2, 2)
	ac := moe.AC{Mode: moe.ACSelective}
	ra, pa, _ := numericRun(t, cfg, l, ac, 1, 2, 2)
	rb, pb, _ := numericRun(t, cfg, l, ac, 1, 2, 2)
	compareRuns(t, "2×4 ep 2 twice", ra, rb, pa, pb, true, 0)
}

// TestNumericStateEqualsMemory: the training state a numeric rank really
// stores (its shards or whole tensors of parameters and buffers, gradients
// and AdamW moments, at the modelled dtypes) equals the memory package's
// analytic State exactly, for every sharding mode on meshes with replicas,
// expert parallelism, dim-0 and dim-1 expert sharding and padding.
func TestNumericStateEqualsMemory(t *testing.T) {
	bias := moetest.TinyMoE()
	bias.Score, bias.SelectionBias, bias.AuxLossCoef = moe.Sigmoid, true, 0
	for _, cfg := range []*moe.Config{moetest.TinyMoE(), bias} {
		for _, c := range [][3]int{{1, 1, 1}, {2, 1, 2}, {4, 2, 1}, {8, 1, 1}, {8, 2, 4}, {8, 1, 4}} {
			for _, sh := range []job.Sharding{job.ShardFSDP, job.ShardZeRO2, job.ShardZeRO1, job.ShardDDP} {
				l := moetest.FSDPLayout(t, c[0], c[1], c[2])
				l.Sharding = sh
				m, err := parallel.NewMesh(l, cfg, 8)
				if err != nil {
					t.Fatal(err)
				}
				init, _ := ref.NewModel[float32](cfg)
				n, err := New(Spec{Spec: job.Spec{Model: cfg, Batch: job.Batch{LBS: 1, Seq: 4, GradAccum: 1}}, Mesh: m}, init.Tensors())
				if err != nil {
					t.Fatal(err)
				}
				rep, err := memory.Estimate(cfg, l, memory.Batch{LBS: 1, Seq: 4, GradAccum: 1}, memory.Options{})
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range n.ranks {
					if got := r.stateBytes(); got != rep.State.Total() {
						t.Errorf("%s bias %v %v %s rank %d: stores %d B, memory says %d (%+v)", cfg.Name, cfg.SelectionBias, c, sh, r.rank, got, rep.State.Total(), rep.State)
					}
				}
			}
		}
	}
}

// TestNumericGradSyncLastOnly: deferring every gradient reduction to the
// last micro-step (the unsharded gradients summed locally before) trains
// as one rank with grad-accum DP·accum does on the same micro-batches,
// within rounding (the reduction of a sum is the sum of the reductions),
// and issues one gradient reduce-scatter per sharded unit per step instead
// of one per micro-step.
func TestNumericGradSyncLastOnly(t *testing.T) {
	cfg := moetest.TinyMoE()
	ac := moe.AC{Mode: moe.ACSelective}
	const accum, steps = 3, 2
	for _, ms := range []struct{ gpus, rep, ep int }{{2, 1, 1}, {4, 2, 2}} {
		l := moetest.FSDPLayout(t, ms.gpus, ms.rep, ms.ep)
		name := fmt.Sprintf("%d×%d ep %d", ms.rep, ms.gpus/ms.rep, ms.ep)
		ra, pa, _ := numericRun(t, cfg, moetest.FSDPLayout(t, 1, 1, 1), ac, 1, accum*l.DP(), steps)
		_, _, every := numericRun(t, cfg, l, ac, 1, accum, 1)
		l.GradSyncLastOnly = true
		rb, pb, last := numericRun(t, cfg, l, ac, 1, accum, steps)
		compareRuns(t, name, ra, rb, pa, pb, false, 1e-5)
		// One more step of each, traced: rank 0's reduce-scatters.
		count := func(n *Trainer) int {
			n.Comm().Trace = true
			if _, err := n.Step(context.Background()); err != nil {
				t.Fatal(err)
			}
			c := 0
			for _, g := range n.Comm().Traces()[0] {
				if g.Kind == parallel.CollReduceScatter {
					c++
				}
			}
			return c
		}
		ce, cl := count(every), count(last)
		if cl == 0 || ce != accum*cl {
			t.Errorf("%s: %d reduce-scatters per step with grad-sync-last-only, %d without; want 1/%d as many", name, cl, ce, accum)
		}
	}
}

// rankCase is a layout trainsAsOneRank runs: gpus in rep replicas with ep
// (and tp, etp: 0 reads as 1), at micro grad-accum micro-steps of the
// one-rank run's 4; exact when the summation order matches one rank's
// (bitwise), else within 1e-5.
type rankCase struct {
	gpus, rep, ep, micro int
	exact                bool
	tp, etp              int
}

// layout resolves the case's layout (FSDP, resharding after forward).
func (c rankCase) layout(t *testing.T) job.Layout {
	t.Helper()
	if c.tp <= 1 {
		return moetest.FSDPLayout(t, c.gpus, c.rep, c.ep)
	}
	l := job.Layout{GPUs: c.gpus, DPReplicate: c.rep, EP: c.ep, TP: c.tp, ETP: c.etp, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	return l
}

// trainsAsOneRank trains cfg 3 steps under selective AC on one rank (lbs
// 1, 4 micro-steps) and on each case's layout over the same micro-batches,
// compares losses and parameters, and returns the one rank's parameters.
// Sequences are 4 tokens, or 2·tp when a case's tp needs more (the
// sequence-parallel split, Layout.CheckSeq).
func trainsAsOneRank(t *testing.T, name string, cfg *moe.Config, cases []rankCase) [][]float32 {
	t.Helper()
	return trainsAsOneRankAC(t, name, cfg, moe.AC{Mode: moe.ACSelective}, cases)
}

// trainsAsOneRankAC is trainsAsOneRank under policy ac.
func trainsAsOneRankAC(t *testing.T, name string, cfg *moe.Config, ac moe.AC, cases []rankCase) [][]float32 {
	t.Helper()
	seq := 4
	for _, tc := range cases {
		seq = max(seq, 2*tc.tp)
	}
	ra, pa, _ := numericRunSeq(t, cfg, moetest.FSDPLayout(t, 1, 1, 1), ac, 1, seq, 4, 3)
	for _, tc := range cases {
		rb, pb, _ := numericRunSeq(t, cfg, tc.layout(t), ac, 1, seq, tc.micro, 3)
		compareRuns(t, fmt.Sprintf("%s %d×%d ep %d tp %d etp %d %s", name, tc.rep, tc.gpus/tc.rep, tc.ep, max(tc.tp, 1), max(tc.etp, 1), ac),
			ra, rb, pa, pb, tc.exact, 1e-5)
	}
	return pa
}
