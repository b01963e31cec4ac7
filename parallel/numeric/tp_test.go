package numeric

import (
	"fmt"
	"reflect"
	"slices"
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

// tpModel is a tiny model every tp ≤ 4 splits: 4 query and 4 KV heads, a
// dense first layer (FFN 8), a MoE layer with 4 experts of width 8 and a
// σ-gated shared expert of width 4, and a vocabulary of 30 that tp 4 splits
// unevenly (chunks of 8, the last padded by 2 rows).
func tpModel(t *testing.T) *moe.Config {
	t.Helper()
	cfg := moetest.TinyMoE()
	cfg.Vocab, cfg.Heads, cfg.KVHeads = 30, 4, 4
	cfg.MoELayer = []bool{false, true}
	cfg.DenseFFN, cfg.ExpertFFN = 8, 8
	cfg.SharedExperts, cfg.SharedFFN, cfg.SharedGated = 1, 4, true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestNumericTPEqualsOneRank: tensor parallelism with sequence parallelism
// (2 and 4 ranks), with FSDP (dp_shard 2 × tp 2), with expert parallelism
// at etp = tp and at etp = 1 (EP borrowing the tp ranks, each routing its
// 1/tp of the tokens), and with replicas, trains 3 steps as one rank does on the same
// global batch (the tp ranks share their data-parallel rank's sequences),
// losses and parameters within 1e-5 relative: not bitwise, since the
// row-parallel linears and the replicated tensors' gradients sum partial
// products over the group, in another order than one rank's GEMM. Every
// checkpointing policy runs, with the aux loss on.
func TestNumericTPEqualsOneRank(t *testing.T) {
	cfg := tpModel(t)
	cases := []rankCase{
		{gpus: 2, rep: 1, ep: 1, micro: 4, tp: 2},
		{gpus: 4, rep: 1, ep: 1, micro: 4, tp: 4},
		{gpus: 4, rep: 1, ep: 1, micro: 2, tp: 2},         // dp_shard 2 × tp 2
		{gpus: 4, rep: 1, ep: 2, micro: 2, tp: 2, etp: 2}, // ep 2 over dp_shard 2, experts split over tp
		{gpus: 2, rep: 1, ep: 2, micro: 4, tp: 2, etp: 1}, // ep 2 borrowing the tp ranks: each routes half the tokens
		{gpus: 4, rep: 1, ep: 4, micro: 2, tp: 2, etp: 1}, // ep 4 over dp_shard 2 × tp 2
		{gpus: 4, rep: 2, ep: 2, micro: 2, tp: 2, etp: 1}, // two replicas of ep 2 × tp 2
	}
	for _, ac := range []moe.AC{{Mode: moe.ACSelective}, {Mode: moe.ACNone}, {Mode: moe.ACFull}, {Mode: moe.ACLayer, Every: 2},
		{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoEAct},
		{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoE}} {
		trainsAsOneRankAC(t, "tp", cfg, ac, cases)
	}
}

// TestNumericTPRefuses: combinations the numeric backend does not execute
// are refused by name.
func TestNumericTPRefuses(t *testing.T) {
	cfg := tpModel(t)
	for _, tc := range []struct {
		l    job.Layout
		seq  int
		want string
	}{
		{job.Layout{GPUs: 4, TP: 4}, 4, "seq = 4 is not divisible by tp × 2·cp"},
	} {
		l := tc.l
		l.Sharding, l.ReshardAfterForward = job.ShardFSDP, true
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		m, err := parallel.NewMesh(l, cfg, 8)
		if err != nil {
			t.Fatal(err)
		}
		init, _ := ref.NewModel[float32](cfg)
		_, err = New(Spec{Spec: job.Spec{Model: cfg, Batch: job.Batch{LBS: 1, Seq: tc.seq, GradAccum: 1}}, Mesh: m}, init.Tensors())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v seq %d: New = %v, want an error saying %q", tc.l, tc.seq, err, tc.want)
		}
	}
}

// tpTrainer builds a trainer of cfg under l (one micro-step of lbs 2 on
// sequences of 2·tp tokens) whose ranks log their tensor-parallel
// collectives and saved tensors.
func tpTrainer(t *testing.T, cfg *moe.Config, l job.Layout, ac moe.AC, micro int) (*Trainer, []*[]moe.SavedRecord) {
	t.Helper()
	m, err := parallel.NewMesh(l, cfg, 8)
	if err != nil {
		t.Fatal(err)
	}
	init, _ := ref.NewModel[float32](cfg)
	init.InitRandom(5)
	n, err := New(Spec{Spec: job.Spec{Model: cfg, AC: ac, Batch: job.Batch{LBS: 2, Seq: 2 * l.TPDegree(), GradAccum: micro}}, Mesh: m, AdamW: ref.DefaultAdamW, AuxCoef: cfg.AuxLossCoef}, init.Tensors())
	if err != nil {
		t.Fatal(err)
	}
	var logs []*[]moe.SavedRecord
	for _, r := range n.ranks {
		r.tp.log = map[int][]parallel.TPColl{}
		lg := &[]moe.SavedRecord{}
		r.rec.log = lg
		logs = append(logs, lg)
	}
	return n, logs
}

func tpLayouts(t *testing.T) []job.Layout {
	t.Helper()
	var ls []job.Layout
	for _, c := range []rankCase{{gpus: 2, rep: 1, ep: 1, tp: 2}, {gpus: 4, rep: 1, ep: 1, tp: 2}, {gpus: 4, rep: 1, ep: 2, tp: 2, etp: 2},
		{gpus: 2, rep: 1, ep: 2, tp: 2, etp: 1}, {gpus: 4, rep: 1, ep: 1, tp: 4}} {
		ls = append(ls, c.layout(t))
	}
	return ls
}

var tpPolicies = []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}, {Mode: moe.ACLayer, Every: 2},
	{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoEAct},
	{Mode: moe.ACModules, Modules: moe.RecomputeLayerNorm | moe.RecomputeMoE}}

// TestTPCollectivesAreTheListed: per layer (embedding, each block, head)
// and micro-step, every rank issues exactly the tensor-parallel
// collectives parallel.TPCollectives lists — same phase, kind, purpose,
// dtype and size, in the same order — under every policy (forward, the
// full recompute's four, the selective re-gathers, backward). And,
// counted independently from the communicator's own trace of the tp
// group: its all-gathers and reduce-scatters are those, its all-reduces
// those plus one gradient all-reduce per unit holding replicated tensors
// (each block and the head) per micro-step.
func TestTPCollectivesAreTheListed(t *testing.T) {
	cfg := tpModel(t)
	const micro = 2
	for _, l := range tpLayouts(t) {
		for _, ac := range tpPolicies {
			n, _ := tpTrainer(t, cfg, l, ac, micro)
			n.Comm().Trace = true
			if _, err := n.Step(t.Context()); err != nil {
				t.Fatal(err)
			}
			b := n.spec.data()
			layers := append([]int{moe.LayerEmbed}, cfg.LayerHead())
			for li := 0; li < cfg.Layers; li++ {
				layers = append(layers, li)
			}
			want := map[parallel.CollKind]int{}
			for _, layer := range layers {
				var w []parallel.TPColl
				for m := 0; m < micro; m++ {
					for _, c := range parallel.TPCollectives(cfg, l, layer, b.LBS*b.Seq, ac, moe.DefaultPrecision.Activation) {
						w = append(w, parallel.TPColl{Phase: c.Phase, Coll: c.Coll, Purpose: c.Purpose, DType: c.DType, Elements: c.Elements})
						want[c.Coll]++
					}
				}
				for _, r := range n.ranks {
					if got := r.tp.log[layer]; !slices.Equal(got, w) {
						t.Errorf("tp %d ep %d etp %d %s rank %d layer %d: issued %v, TPCollectives lists %v", l.TP, l.EP, l.ETP, ac, r.rank, layer, got, w)
					}
				}
			}
			want[parallel.CollAllReduce] += micro * (cfg.Layers + 1)
			for r, tr := range n.Comm().Traces() {
				got := map[parallel.CollKind]int{}
				for _, c := range tr {
					if c.Axis == parallel.AxisTP {
						got[c.Kind]++
					}
				}
				for _, k := range []parallel.CollKind{parallel.CollAllGather, parallel.CollReduceScatter, parallel.CollAllReduce} {
					if got[k] != want[k] {
						t.Errorf("tp %d ep %d %s rank %d: %d %s on the tp group, want %d", l.TP, l.EP, ac, r, got[k], k, want[k])
					}
				}
			}
		}
	}
}

// TestTPSavedEqualsMemory: what each tp rank keeps for backward (the
// reference's records of its local tensors) equals memory.Saved's
// tensor-parallel split record by record, per layer, under every policy.
// Expert parallelism is left out: its stage keeps another set of expert
// tensors than the analytic table, with or without tp.
func TestTPSavedEqualsMemory(t *testing.T) {
	cfg := tpModel(t)
	for _, l := range tpLayouts(t) {
		if l.EP > 1 {
			continue
		}
		for _, ac := range tpPolicies {
			n, logs := tpTrainer(t, cfg, l, ac, 1)
			if _, err := n.Step(t.Context()); err != nil {
				t.Fatal(err)
			}
			b := n.spec.data()
			sh := memoryShape(l, b, ac)
			var want []moe.SavedRecord
			for _, layer := range append([]int{moe.LayerEmbed}, seqInts(cfg.Layers+1)...) {
				rs, err := memory.Saved(cfg, layer, sh)
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, rs...)
			}
			for r, lg := range logs {
				if d := diffRecords(*lg, want); d != "" {
					t.Errorf("tp %d dp_shard %d %s rank %d: saved tensors differ from memory's TP split: %s", l.TP, l.DPShard, ac, r, d)
				}
			}
		}
	}
}

func seqInts(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// memoryShape is the memory package's shape of a numeric run's micro-batch.
func memoryShape(l job.Layout, b parallel.Batch, ac moe.AC) memory.Shape {
	return memory.Shape{Batch: b.LBS, Seq: b.Seq, AC: ac, EP: l.EP, Act: moe.DefaultPrecision.Activation,
		TP: l.TPDegree(), ExpertTP: l.ExpertTP(), ExpertRows: l.TokensPerExpertRank()}
}

// diffRecords compares two multisets of records; "" when equal, else the
// records only one side has.
func diffRecords(got, want []moe.SavedRecord) string {
	key := func(r moe.SavedRecord) string {
		return fmt.Sprintf("layer %d %s.%s %d×%s", r.Layer, r.Op, r.Tensor, r.Elements, r.DType)
	}
	count := map[string]int{}
	for _, r := range got {
		count[key(r)]++
	}
	for _, r := range want {
		count[key(r)]--
	}
	var d []string
	for k, c := range count {
		switch {
		case c > 0:
			d = append(d, fmt.Sprintf("recorded only: %s (×%d)", k, c))
		case c < 0:
			d = append(d, fmt.Sprintf("memory only: %s (×%d)", k, -c))
		}
	}
	slices.Sort(d)
	return strings.Join(d, "; ")
}

// TestNumericTPFollowsSchedule: under tp every rank issues, on each of its
// communicators (each mesh axis), BuildSchedule's collectives for the
// layout (sized by the recorded expert counts) in the schedule's order,
// on the tp group the all-reduce per unit holding replicated tensors
// (each block's, the head's) and micro-step of the norms', router's and
// shared-expert gate's gradients included. Across communicators the order may differ in
// one place: a rank gathers a MoE block's expert unit (FSDP) when the
// block starts, the schedule after the block's first tensor-parallel
// collectives. Every sharding mode and policy meets the tp layouts.
func TestNumericTPFollowsSchedule(t *testing.T) {
	cfg := tpModel(t)
	const micro = 2
	shardings := []job.Sharding{job.ShardFSDP, job.ShardZeRO2, job.ShardZeRO1, job.ShardDDP}
	for k, l := range tpLayouts(t) {
		for j, ac := range tpPolicies {
			l.Sharding = shardings[(j+k)%len(shardings)]
			n, _ := tpTrainer(t, cfg, l, ac, micro)
			b := n.spec.data()
			s, err := parallel.BuildSchedule(parallel.ScheduleSpec{Spec: job.Spec{Model: cfg, AC: ac, Batch: job.Batch{LBS: b.LBS, Seq: b.Seq, GradAccum: micro}, Recipe: job.EagerRecipe()}, Mesh: n.spec.Mesh})
			if err != nil {
				t.Fatal(err)
			}
			n.Comm().Trace = true
			res, err := n.Step(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("tp %d dp_shard %d ep %d etp %d %s %s", l.TP, l.DPShard, l.EP, l.ETP, l.Sharding, ac)
			for r, trace := range n.Comm().Traces() {
				sr, err := s.WithCounts(n.spec.Mesh, r, res.ExpertCounts, cfg.Experts, cfg.Hidden)
				if err != nil {
					t.Fatal(err)
				}
				got, want := map[parallel.Axis][]collective.Record{}, map[parallel.Axis][]collective.Record{}
				for _, c := range trace {
					got[c.Axis] = append(got[c.Axis], c)
				}
				for _, o := range sr.Ops {
					if o.Type == parallel.OpCollective {
						want[o.Axis] = append(want[o.Axis], collective.Record{Kind: o.Coll, Axis: o.Axis, DType: o.DType, Elements: o.Elements})
					}
				}
				for _, ax := range parallel.MeshAxes() {
					g, w := got[ax], want[ax]
					for i := range max(len(g), len(w)) {
						if i >= len(g) || i >= len(w) || g[i] != w[i] {
							t.Fatalf("%s rank %d on %s: %d collectives, the schedule's %d; first difference at %d", name, r, ax, len(g), len(w), i)
						}
					}
				}
			}
		}
	}
}

// TestNumericTPStateEqualsMemory: the training state a tp rank stores (its
// tensor-parallel pieces, FSDP-sharded or whole as the sharding mode says)
// equals memory's State exactly on every tp layout and sharding mode.
func TestNumericTPStateEqualsMemory(t *testing.T) {
	cfg := tpModel(t)
	for _, l := range tpLayouts(t) {
		for _, sh := range []job.Sharding{job.ShardFSDP, job.ShardZeRO2, job.ShardZeRO1, job.ShardDDP} {
			l.Sharding = sh
			m, err := parallel.NewMesh(l, cfg, 8)
			if err != nil {
				t.Fatal(err)
			}
			init, _ := ref.NewModel[float32](cfg)
			seq := 2 * l.TPDegree()
			n, err := New(Spec{Spec: job.Spec{Model: cfg, Batch: job.Batch{LBS: 1, Seq: seq, GradAccum: 1}}, Mesh: m}, init.Tensors())
			if err != nil {
				t.Fatal(err)
			}
			rep, err := memory.Estimate(cfg, l, memory.Batch{LBS: 1, Seq: seq, GradAccum: 1}, memory.Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range n.ranks {
				if got := r.stateBytes(); got != rep.State.Total() {
					t.Errorf("tp %d dp_shard %d ep %d etp %d %s rank %d: stores %d B, memory says %d (%+v)", l.TP, l.DPShard, l.EP, l.ETP, sh, r.rank, got, rep.State.Total(), rep.State)
				}
			}
		}
	}
}

// TestNumericTPModelFeatures: the parts of the model tensor parallelism
// touches beyond tpModel train as one rank under tp 2 (alone, with ep 2
// at etp 1 and at etp 2): grouped-query attention (2 query heads per KV
// head, one KV head per rank), q/k/v biases (split with their rows), a
// sliding window, sigmoid routing with a selection bias updated from loads
// counted once per group (or per rank's own rows at etp 1), DeepSeek's
// sequence-level aux loss, and tied embeddings (the LM head reads the
// embedding's vocabulary rows).
func TestNumericTPModelFeatures(t *testing.T) {
	base := tpModel(t)
	variants := map[string]func(c *moe.Config){
		"gqa+bias+window": func(c *moe.Config) { c.KVHeads, c.QKVBias, c.Window = 2, true, []int{3, 0} },
		"sigmoid+selection bias": func(c *moe.Config) {
			c.Score, c.SelectionBias, c.RoutedScale = moe.Sigmoid, true, 2.5
			c.AuxLossCoef, c.OutputRouterLogits = 0, false
			c.Groups, c.TopKGroups = 2, 1
		},
		"seq aux": func(c *moe.Config) { c.SeqAuxLoss = true },
		"tied":    func(c *moe.Config) { c.TiedEmbeddings = true },
	}
	cases := []rankCase{
		{gpus: 2, rep: 1, ep: 1, micro: 4, tp: 2},
		{gpus: 2, rep: 1, ep: 2, micro: 4, tp: 2, etp: 1},
		{gpus: 4, rep: 1, ep: 2, micro: 2, tp: 2, etp: 2},
	}
	for name, f := range variants {
		cfg := *base
		f(&cfg)
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		pa := trainsAsOneRank(t, name, &cfg, cases)
		if cfg.SelectionBias {
			// The loads that moved the biases are one rank's, exactly:
			// signs alone (the update's) would hide a group counted twice.
			_, _, one := numericRunSeq(t, &cfg, moetest.FSDPLayout(t, 1, 1, 1), moe.AC{Mode: moe.ACSelective}, 1, 4, 4, 1)
			for _, tc := range cases {
				_, _, n := numericRunSeq(t, &cfg, tc.layout(t), moe.AC{Mode: moe.ACSelective}, 1, 4, tc.micro, 1)
				for _, r := range n.ranks {
					if !reflect.DeepEqual(r.loads, one.ranks[0].loads) {
						t.Errorf("%s %+v rank %d: loads %v, one rank %v", name, tc, r.rank, r.loads, one.ranks[0].loads)
					}
				}
			}
			for i, p := range cfg.Params() {
				if p.Buffer && slices.Max(pa[i]) == 0 && slices.Min(pa[i]) == 0 {
					t.Errorf("%s: %s stayed zero", name, p.Name)
				}
			}
		}
	}
}

// TestVocabLo: member idx of tp holds the vocabulary rows from
// idx·⌈vocab/tp⌉ (hand-derived: 30 rows over 4 are 8, 8, 8 and 6; 10 over
// 4 are 3, 3, 3 and 1; 32 over 2 are 16 and 16).
func TestVocabLo(t *testing.T) {
	for _, c := range []struct {
		vocab, tp int
		want      []int
	}{
		{30, 4, []int{0, 8, 16, 24}},
		{10, 4, []int{0, 3, 6, 9}},
		{32, 2, []int{0, 16}},
	} {
		for idx, want := range c.want {
			if got := vocabLo(c.vocab, c.tp, idx); got != want {
				t.Errorf("vocabLo(%d, %d, %d) = %d, want %d", c.vocab, c.tp, idx, got, want)
			}
		}
	}
}
