package numeric

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/moe/moetest"
	"github.com/moescope/moescope/moe/ref"
	"github.com/moescope/moescope/parallel"
)

// cpTrainer builds the Trainer of layout l (cp > 1, resolved) on the
// folded mesh, as train does.
func cpTrainer(t *testing.T, cfg *moe.Config, l job.Layout, ac moe.AC, lbs, seq, micro int) (*Trainer, error) {
	t.Helper()
	m, err := parallel.NewMesh(l.FoldCP(), cfg, 4)
	if err != nil {
		t.Fatal(err)
	}
	init, err := ref.NewModel[float32](cfg)
	if err != nil {
		t.Fatal(err)
	}
	init.InitRandom(7)
	spec := Spec{Spec: job.Spec{Model: cfg, AC: ac, Batch: job.Batch{LBS: lbs, Seq: seq, GradAccum: micro}}, Mesh: m, DataSeed: 11,
		AdamW: ref.AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}, AuxCoef: cfg.AuxLossCoef, BiasRate: 1e-3,
		CP: CP{Degree: l.CP, Method: l.CPMethod, Balancer: l.CPLoadBalancer}}
	return New(spec, init.Tensors())
}

func cpLayout(t *testing.T, gpus, cp, ep int, method job.CPMethod, lb job.CPLoadBalancer) job.Layout {
	t.Helper()
	return cpLayoutRep(t, gpus, 1, cp, ep, method, lb)
}

func cpLayoutRep(t *testing.T, gpus, rep, cp, ep int, method job.CPMethod, lb job.CPLoadBalancer) job.Layout {
	t.Helper()
	l := job.Layout{GPUs: gpus, DPReplicate: rep, CP: cp, EP: ep, CPMethod: method, CPLoadBalancer: lb, Sharding: job.ShardFSDP, ReshardAfterForward: true}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestNumericCPEqualsOneRank: cp ranks splitting every sequence produce
// the losses (cross-entropy per micro-batch, aux loss) and parameters of
// one rank reading the same sequences whole, after 3 steps: one rank at
// the same lbs with grad-accum = the data-parallel degree × the cp run's
// (DESIGN.md's batch contract; cp adds no data-parallel rank). cp 2 and 4,
// every exchange method, with and without the load balancer, alone, with
// FSDP over dp_shard × cp and with EP borrowing the cp ranks; within 1e-5
// relative (the ring's online softmax and the reduce-scatter of dK/dV sum
// in other orders than the one-rank flash kernel).
func TestNumericCPEqualsOneRank(t *testing.T) {
	cfg := moetest.TinyMoE()
	const seq, steps = 16, 3
	type tc struct {
		gpus, cp, ep int
		method       job.CPMethod
		lb           job.CPLoadBalancer
		ac           moe.AC // zero: selective
	}
	cases := []tc{
		{2, 2, 1, job.CPAllGather, job.CPHeadTail, moe.AC{}}, {2, 2, 1, job.CPP2P, job.CPHeadTail, moe.AC{}}, {2, 2, 1, job.CPAllToAll, job.CPNoBalance, moe.AC{}},
		{2, 2, 1, job.CPP2P, job.CPNoBalance, moe.AC{}}, {4, 4, 1, job.CPAllGather, job.CPNoBalance, moe.AC{}}, {4, 4, 1, job.CPP2P, job.CPHeadTail, moe.AC{}},
		{4, 2, 1, job.CPP2P, job.CPHeadTail, moe.AC{}}, {4, 2, 1, job.CPAllGather, job.CPNoBalance, moe.AC{}}, // FSDP: dp_shard 2 × cp 2
		{2, 2, 2, job.CPP2P, job.CPHeadTail, moe.AC{}}, {4, 2, 2, job.CPAllGather, job.CPHeadTail, moe.AC{}}, {4, 2, 4, job.CPP2P, job.CPNoBalance, moe.AC{}}, // EP
	}
	// Every checkpointing policy on two cases (a recompute runs the
	// exchange again).
	for _, a := range []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACFull}, {Mode: moe.ACLayer, Every: 2}} {
		cases = append(cases, tc{2, 2, 1, job.CPP2P, job.CPHeadTail, a}, tc{4, 2, 2, job.CPAllGather, job.CPNoBalance, a})
	}
	type refKey struct {
		dp int
		ac string
	}
	ref := map[refKey][]StepResult{}
	refP := map[refKey][][]float32{}
	for _, c := range cases {
		if c.ac.Mode == "" {
			c.ac = moe.AC{Mode: moe.ACSelective}
		}
		k := refKey{c.gpus / c.cp, c.ac.String()}
		if ref[k] == nil {
			ref[k], refP[k], _ = numericRunSeq(t, cfg, moetest.FSDPLayout(t, 1, 1, 1), c.ac, 1, seq, k.dp*2, steps)
		}
		n, err := cpTrainer(t, cfg, cpLayout(t, c.gpus, c.cp, c.ep, c.method, c.lb), c.ac, 1, seq, 2)
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
		compareRuns(t, fmt.Sprintf("gpus %d cp %d ep %d %s %s %s", c.gpus, c.cp, c.ep, c.method, c.lb, c.ac), ref[k], res, refP[k], n.Params(), false, 1e-5)
	}
}

// TestNumericCPHSDPSelectionBias: cp inside HSDP replicas (dp_replicate 2
// × dp_shard 1 × cp 2) and a sigmoid router whose selection bias moves by
// the step's loads, each cp rank counting its own tokens' rows, equal one
// rank at grad-accum 2 × 2 (within 1e-5: replicas' partial sums).
func TestNumericCPHSDPSelectionBias(t *testing.T) {
	cfg := moetest.TinyMoE()
	cfg.Score, cfg.SelectionBias, cfg.RoutedScale = moe.Sigmoid, true, 2.5
	cfg.AuxLossCoef, cfg.OutputRouterLogits = 0, false
	cfg.Groups, cfg.TopKGroups = 2, 1
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ac := moe.AC{Mode: moe.ACSelective}
	for _, c := range []*moe.Config{moetest.TinyMoE(), cfg} {
		want, pw, _ := numericRunSeq(t, c, moetest.FSDPLayout(t, 1, 1, 1), ac, 1, 16, 4, 3)
		n, err := cpTrainer(t, c, cpLayoutRep(t, 4, 2, 2, 1, job.CPP2P, job.CPHeadTail), ac, 1, 16, 2)
		if err != nil {
			t.Fatal(err)
		}
		var got []StepResult
		for s := 0; s < 3; s++ {
			r, err := n.Step(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, r)
		}
		compareRuns(t, fmt.Sprintf("%s rep 2 cp 2", c.Score), want, got, pw, n.Params(), false, 1e-5)
	}
}

// TestCPAttentionWork counts the score entries each cp rank's attention
// computes for one causal sequence of 8 tokens at cp 2, per head (hand
// derivation: a query at position p sees p+1 keys). headtail deals chunks
// {0,3} and {1,2} of 2 tokens: rank 0 holds positions 0,1,6,7 (1+2+7+8 =
// 18), rank 1 positions 2,3,4,5 (3+4+5+6 = 18): equal. none deals 0–3
// (1+2+3+4 = 10) and 4–7 (5+6+7+8 = 26). Both sum to 8·9/2 = 36. Counted
// over one step's forwards: 2 layers, lbs 1, 1 micro-step, selective AC
// (no attention recompute).
func TestCPAttentionWork(t *testing.T) {
	cfg := moetest.TinyMoE()
	for _, c := range []struct {
		lb   job.CPLoadBalancer
		want []int64
	}{{job.CPHeadTail, []int64{18, 18}}, {job.CPNoBalance, []int64{10, 26}}} {
		n, err := cpTrainer(t, cfg, cpLayout(t, 2, 2, 1, job.CPP2P, c.lb), moe.AC{Mode: moe.ACSelective}, 1, 8, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
		var got []int64
		for _, r := range n.ranks {
			got = append(got, r.cp.scores/int64(cfg.Layers))
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: score entries per rank and layer %v, want %v", c.lb, got, c.want)
		}
	}
}

// TestCPPositions: the balancer's shards, by hand for seq 8 at cp 2.
func TestCPPositions(t *testing.T) {
	ht := CP{Degree: 2, Balancer: job.CPHeadTail}
	no := CP{Degree: 2, Balancer: job.CPNoBalance}
	for _, c := range []struct {
		got, want []int
	}{
		{ht.Positions(8, 0), []int{0, 1, 6, 7}}, {ht.Positions(8, 1), []int{2, 3, 4, 5}},
		{no.Positions(8, 0), []int{0, 1, 2, 3}}, {no.Positions(8, 1), []int{4, 5, 6, 7}},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("positions %v, want %v", c.got, c.want)
		}
	}
}

// TestNumericCPRefuses: what the numeric CP ranks do not run is refused
// by name.
func TestNumericCPRefuses(t *testing.T) {
	sw := moetest.TinyMoE()
	sw.Window = []int{0, 4}
	sq := moetest.TinyMoE()
	sq.SeqAuxLoss = true
	for _, c := range []struct {
		cfg  *moe.Config
		l    job.Layout
		seq  int
		want string
	}{
		{moetest.TinyMoE(), cpLayout(t, 2, 2, 1, job.CPAllGather, job.CPPTRR), 16, "ptrr"},
		{sw, cpLayout(t, 2, 2, 1, job.CPAllGather, job.CPHeadTail), 16, "layer 1 has a sliding window of 4"},
		{sq, cpLayout(t, 2, 2, 1, job.CPAllGather, job.CPHeadTail), 16, "seq_aux_loss"},
		{moetest.TinyMoE(), cpLayout(t, 2, 2, 1, job.CPAllGather, job.CPHeadTail), 6, "seq = 6 is not divisible by tp × 2·cp"},
	} {
		_, err := cpTrainer(t, c.cfg, c.l, moe.AC{Mode: moe.ACSelective}, 1, c.seq, 1)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error naming %q", c.l.CPLoadBalancer, err, c.want)
		}
	}
}

// TestCPCollectives counts each rank's collectives on its cp group in one
// step (2 layers, 1 micro-step, selective AC: no attention recompute), by
// the methods' definitions: allgather runs per layer one all-gather of K/V
// forward, and backward one all-gather and one reduce-scatter of dK/dV;
// a ring of cp members runs per layer cp−1 forward hops and cp backward
// (cp−1 of K/V with dK/dV, one of dK/dV home). The aux loss adds one
// all-gather of the expert totals per micro-step. Elements: a hop carries
// the rank's lbs·seq/cp tokens × 2·G·d (K and V; 4·G·d with dK/dV).
func TestCPCollectives(t *testing.T) {
	cfg := moetest.TinyMoE() // G·d = 1·4
	const seq, cp = 16, 4
	const tok = seq / cp
	for _, c := range []struct {
		method job.CPMethod
		want   map[parallel.CollKind][]int64 // element counts in order, per kind
	}{
		{job.CPAllGather, map[parallel.CollKind][]int64{
			// forward L0, L1 gathers; aux totals (2·E f64 = 16 words ×
			// cp); backward L1, L0 re-gathers with their reduce-scatters.
			parallel.CollAllGather:     {cp * tok * 8, cp * tok * 8, cp * 16, cp * tok * 8, cp * tok * 8},
			parallel.CollReduceScatter: {cp * tok * 8, cp * tok * 8},
		}},
		{job.CPP2P, map[parallel.CollKind][]int64{
			parallel.CollAllGather: {cp * 16},
			parallel.CollAllToAll: {tok * 8, tok * 8, tok * 8, tok * 8, tok * 8, tok * 8, // forward: 3 hops × 2 layers
				tok * 16, tok * 16, tok * 16, tok * 8, tok * 16, tok * 16, tok * 16, tok * 8}, // backward per layer: 3 joined, 1 home
		}},
	} {
		n, err := cpTrainer(t, cfg, cpLayout(t, cp, cp, 1, c.method, job.CPHeadTail), moe.AC{Mode: moe.ACSelective}, 1, seq, 1)
		if err != nil {
			t.Fatal(err)
		}
		n.Comm().Trace = true
		if _, err := n.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
		for r, recs := range n.Comm().Traces() {
			got := map[parallel.CollKind][]int64{}
			for _, rec := range recs {
				if rec.Axis == axisCP {
					got[rec.Kind] = append(got[rec.Kind], rec.Elements)
				}
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("%s rank %d: cp collectives %v, want %v", c.method, r, got, c.want)
			}
		}
	}
}
