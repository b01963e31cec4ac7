package plan

import (
	"strings"
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/hw"
)

// knobsAt runs KnobEffects for Qwen3-30B-A3B on one 8-GPU host of dev at
// the given point, compiled (the CLI's default), and returns the effects
// by setting.
func knobsAt(t *testing.T, gpu string, l job.Layout, lbs int) (map[string]KnobEffect, []KnobEffect) {
	t.Helper()
	cfg, _ := qwenOnB200(t)
	dev, err := hw.LookupDevice(gpu)
	if err != nil {
		t.Fatal(err)
	}
	run := job.DefaultSpec(cfg)
	run.Seq = 4096
	e := &SimEvaluator{Run: run, Device: dev}
	p := Point{Layout: l, AC: moe.AC{Mode: moe.ACSelective}, LBS: lbs, GradAccum: 1}
	s, err := e.Evaluate(p)
	if err != nil {
		t.Fatal(err)
	}
	effs, err := e.KnobEffects(Result{Point: p, Score: s}, 0.92)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]KnobEffect{}
	for _, k := range effs {
		by[k.Setting] = k
	}
	if effs[0].TPS != s.TPS || effs[0].MemoryFraction != s.MemoryFraction {
		t.Errorf("the plan's own row %+v is not its score %+v", effs[0], s)
	}
	return by, effs
}

// TestKnobEffects checks properties that follow from the models' stated
// mechanisms, not values: loss chunking changes no time (the simulator
// prices no chunked-loss pass) and lowers memory (docs/memory.md: the
// chunked loss holds one chunk's logits); an eager run holds the loss's
// fp32 logits, so it needs more memory than the compiled one; every
// setting that applies is listed once, ranked by TPS gained, the
// dispatcher only with ep > 1; and each max lbs is the last local batch
// within the target.
func TestKnobEffects(t *testing.T) {
	l := job.Layout{GPUs: 8, DPShard: 8, DPReplicate: 1, EP: 8, Sharding: job.ShardFSDP, ReshardAfterForward: true, GPUsPerNode: 8}
	by, effs := knobsAt(t, "b200", l, 4)
	plan := effs[0]
	chunk := by["--loss-chunks 8"]
	if chunk.TPS != plan.TPS || !(chunk.MemoryFraction < plan.MemoryFraction) || chunk.MaxLBS < plan.MaxLBS {
		t.Errorf("loss chunks: %+v against the plan %+v", chunk, plan)
	}
	if eager := by["--compile=false"]; !(eager.MemoryFraction > plan.MemoryFraction) || !(eager.TPS < plan.TPS) {
		t.Errorf("eager: %+v against the plan %+v", eager, plan)
	}
	for _, s := range []string{"--dispatcher deepep", "--dispatcher hybridep", "--reshard-after-forward=false", "--reduce-dtype bf16",
		"--compile-components model", "--precision mxfp8", "--precision fp8-current", "--precision fp8-tensorwise"} {
		if _, ok := by[s]; !ok {
			t.Errorf("%s not listed", s)
		}
	}
	// Full CUDA graphs at ep 8 are refused by name (the dispatch's host
	// sync); per-layer graphs and fused QKV are turned.
	if g := by["--cuda-graphs full"]; !strings.Contains(g.Refused, "--cuda-graphs full with ep = 8") {
		t.Errorf("full graphs at ep 8: %+v", g)
	}
	for _, s := range []string{"--cuda-graphs layers", "--fused-qkv"} {
		if k, ok := by[s]; !ok || k.Refused != "" || !(k.TPS >= plan.TPS) {
			t.Errorf("%s: %+v (listed %v), want at least the plan's %g TPS", s, k, ok, plan.TPS)
		}
	}
	if _, ok := by["--dispatcher all_to_all"]; ok || len(by) != len(effs) {
		t.Errorf("the plan's own dispatcher listed, or a setting twice: %v", effs)
	}
	for i := 2; i < len(effs); i++ {
		if effs[i].Refused == "" && effs[i].TPSChange > effs[i-1].TPSChange {
			t.Errorf("not ranked by TPS gained: %s after %s", effs[i].Setting, effs[i-1].Setting)
		}
	}
	// Without expert parallelism no dispatcher is turned; on an H100 the
	// MX recipe is refused, naming why.
	l.EP = 1
	by, _ = knobsAt(t, "h100", l, 1)
	if _, ok := by["--dispatcher deepep"]; ok {
		t.Error("dispatcher turned at ep 1")
	}
	if mx := by["--precision mxfp8"]; !strings.Contains(mx.Refused, "MX") {
		t.Errorf("mxfp8 on h100: %+v", mx)
	}
}

// TestMaxLBS: maxLBS is the last local batch within the target, by a
// scan the bisection must agree with.
func TestMaxLBS(t *testing.T) {
	cfg, dev := qwenOnB200(t)
	e := &SimEvaluator{Run: eagerRun(cfg, 4096), Device: dev}
	p := Point{Layout: job.Layout{GPUs: 8, DPShard: 8, DPReplicate: 1, EP: 8, Sharding: job.ShardFSDP, ReshardAfterForward: true, GPUsPerNode: 8},
		AC: moe.AC{Mode: moe.ACSelective}, LBS: 3, GradAccum: 1}
	for _, target := range []float64{0.3, 0.6, 0.92} {
		want := 0
		for lbs := 1; lbs <= 4*p.LBS; lbs++ {
			q := p
			q.LBS = lbs
			if m, err := e.MemoryFraction(q); err == nil && m <= target {
				want = lbs
			}
		}
		if got := e.maxLBS(p, target); got != want {
			t.Errorf("target %.2f: maxLBS %d, the scan %d", target, got, want)
		}
	}
}

// TestStackAdmit: a search skips the points whose stack the simulator
// refuses at their layout (full CUDA graphs with ep > 1) and admits the
// rest, then asks the admit behind it.
func TestStackAdmit(t *testing.T) {
	cfg, _ := qwenOnB200(t)
	run := job.DefaultSpec(cfg)
	run.CUDAGraphs = job.FullGraphs
	asked := 0
	admit := StackAdmit(run, func(Point) error { asked++; return nil })
	at := func(ep int) Point {
		return Point{Layout: job.Layout{GPUs: 8, DPShard: 8, DPReplicate: 1, EP: ep, Sharding: job.ShardFSDP}}
	}
	if err := admit(at(8)); err == nil || !strings.Contains(err.Error(), "--cuda-graphs full with ep = 8") || asked != 0 {
		t.Errorf("ep 8: %v (asked %d)", err, asked)
	}
	if err := admit(at(1)); err != nil || asked != 1 {
		t.Errorf("ep 1: %v (asked %d)", err, asked)
	}
}

// TestStackAdmitAC: under Megatron-Core's TE blocks or AutoModel's modules
// a search skips torchtitan's per-op selective checkpointing, which those
// modules do not run, and admits full checkpointing.
func TestStackAdmitAC(t *testing.T) {
	cfg, _ := qwenOnB200(t)
	for _, impl := range []job.TransformerImpl{job.TETransformer, job.AutoModelTransformer} {
		run := job.DefaultSpec(cfg)
		run.Compile, run.TransformerImpl, run.Dispatcher = false, impl, job.DeepEP
		if err := run.Recipe.Resolve(); err != nil {
			t.Fatal(err)
		}
		admit := StackAdmit(run, nil)
		at := func(mode moe.ACMode) Point {
			return Point{Layout: job.Layout{GPUs: 8, DPShard: 8, DPReplicate: 1, EP: 8, Sharding: job.ShardFSDP}, AC: moe.AC{Mode: mode}}
		}
		if err := admit(at(moe.ACSelective)); err == nil || !strings.Contains(err.Error(), "selective") {
			t.Errorf("%s, selective: %v, want refused", impl, err)
		}
		if err := admit(at(moe.ACFull)); err != nil {
			t.Errorf("%s, full: %v", impl, err)
		}
	}
}
