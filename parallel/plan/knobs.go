package plan

import (
	"cmp"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"

	"github.com/moescope/moescope/memory"
	"github.com/moescope/moescope/moe/job"
	"github.com/moescope/moescope/parallel/sim"
)

// knob is one setting of the stack the planner can turn for a plan: what
// it is called (as its flag is written) and the edit, which reports
// whether it applies to the run and the point.
type knob struct {
	setting string
	edit    func(s *job.Spec, p *Point) bool
}

// chunkedLoss is torchtitan main's chunked cross-entropy's default chunk
// count (ChunkedLossWrapper.Config.num_chunks = 8, pytorch/torchtitan
// b5bcd76 torchtitan/components/loss.py:544).
const chunkedLoss = 8

// knobs are the settings KnobEffects turns, each from its state in s to
// each other value: the loss's compile (when the model is compiled),
// reshard-after-forward (FSDP without a pipeline), the settings a search
// can vary (searchSettings: compile, loss chunking, the dispatcher with
// ep > 1, the reduce type) and the precision recipe (each other priced one).
func knobs(s job.Spec) []knob {
	model, loss := s.Compiled()
	ks := []knob{
		{"--compile-components " + map[bool]string{true: "model", false: "model,loss"}[loss], func(s *job.Spec, _ *Point) bool {
			s.CompileComponents = job.Components{job.ModelComponent}
			if !loss {
				s.CompileComponents = append(s.CompileComponents, job.LossComponent)
			}
			return model
		}},
		{flagName("reshard-after-forward", !s.Layout.ReshardAfterForward), func(_ *job.Spec, p *Point) bool {
			p.Layout.ReshardAfterForward = !p.Layout.ReshardAfterForward
			return p.Layout.Sharding == job.ShardFSDP && p.Layout.Stages() == 1
		}},
	}
	for _, st := range searchSettings {
		for v := range st.values {
			r := s.Recipe
			st.apply(&r, v)
			if label := st.label(r); label != st.label(s.Recipe) {
				ks = append(ks, knob{label, func(s *job.Spec, p *Point) bool {
					st.apply(&s.Recipe, v)
					return !st.moe || p.Layout.EP > 1
				}})
			}
		}
	}
	for _, pr := range job.PricedPrecisions {
		ks = append(ks, knob{"--precision " + string(pr), func(s *job.Spec, _ *Point) bool {
			was := s.Precision
			s.Precision, s.Quantize, s.FP8AllGather, s.FP8RowwiseGWHP = pr, nil, false, false
			return was != pr
		}})
	}
	return ks
}

// flagName is a boolean flag as a user turns it: --name or --name=false.
func flagName(name string, on bool) string {
	if on {
		return "--" + name
	}
	return "--" + name + "=false"
}

// KnobEffect is what turning one setting would do to a plan: its TPS
// (with the 90% interval), memory and whether it fits at the same point,
// and the largest local batch within the memory target (the point's
// accumulation kept).
type KnobEffect struct {
	Setting        string      `json:"setting"`
	TPS            float64     `json:"tps,omitempty"`
	TPSInterval    *[2]float64 `json:"tps_interval,omitempty"`
	TPSChange      float64     `json:"tps_change,omitempty"` // TPS ÷ the plan's − 1
	MemoryFraction float64     `json:"memory_fraction,omitempty"`
	Fits           bool        `json:"fits"`
	MaxLBS         int         `json:"max_lbs"` // 0: no local batch fits the target
	Refused        string      `json:"refused,omitempty"`
}

// KnobEffects turns each setting of the stack that applies to the plan r
// (knobs) and predicts the plan with it, keeping its layout, checkpointing,
// local batch and accumulation: the sensitivity a team measures by hand.
// The first entry is the plan itself. A setting the device or the model
// cannot run is listed with the reason it is refused.
func (e *SimEvaluator) KnobEffects(r Result, target float64) ([]KnobEffect, error) {
	base, err := e.knobEffect(e, r.Point, target, "(the plan)", r.Score.TPS)
	if err != nil {
		return nil, err
	}
	resolved := e.Run
	if err := resolved.Recipe.Resolve(); err != nil {
		return nil, err
	}
	at := resolved
	at.Layout = r.Point.Layout
	// Each setting on its own evaluator, the settings in parallel (as the
	// search's points are), kept in knobs' order.
	ks := knobs(at)
	effs, errs := make([]KnobEffect, len(ks)), make([]error, len(ks))
	applies := make([]bool, len(ks))
	_ = parallelDo(len(ks), runtime.GOMAXPROCS(0), func(i int) error { // failures are in errs
		run, p := resolved, r.Point
		if applies[i] = ks[i].edit(&run, &p); applies[i] {
			ev := &SimEvaluator{Run: run, Device: e.Device, Cluster: e.Cluster, Calibration: e.Calibration}
			effs[i], errs[i] = e.knobEffect(ev, p, target, ks[i].setting, base.TPS)
		}
		return nil
	})
	var turned, refused []KnobEffect
	for i, k := range ks {
		switch {
		case !applies[i]:
		case errs[i] != nil:
			refused = append(refused, KnobEffect{Setting: k.setting, Refused: errs[i].Error()})
		default:
			turned = append(turned, effs[i])
		}
	}
	// Ranked by what each buys: the largest gain in TPS first.
	slices.SortStableFunc(turned, func(a, b KnobEffect) int { return cmp.Compare(b.TPSChange, a.TPSChange) })
	return append(append([]KnobEffect{base}, turned...), refused...), nil
}

// knobEffect predicts p on ev and finds its largest local batch within
// target; baseTPS is the plan's, for the change.
func (e *SimEvaluator) knobEffect(ev *SimEvaluator, p Point, target float64, setting string, baseTPS float64) (KnobEffect, error) {
	if err := ev.Run.Recipe.Resolve(); err != nil {
		return KnobEffect{}, err
	}
	if err := ev.Device.Runs(ev.Run.Precision); err != nil {
		return KnobEffect{}, err
	}
	s, err := ev.Evaluate(p)
	if err != nil {
		return KnobEffect{}, err
	}
	iv, err := ev.Interval(p, s)
	if err != nil {
		return KnobEffect{}, err
	}
	eff := KnobEffect{Setting: setting, TPS: s.TPS, TPSInterval: iv, TPSChange: s.TPS/baseTPS - 1,
		MemoryFraction: s.MemoryFraction, Fits: !s.DoesNotFit && s.MemoryFraction <= target}
	eff.MaxLBS = ev.maxLBS(p, target)
	return eff, nil
}

// maxLBS is the largest local batch of p's layout, checkpointing and
// accumulation whose memory is within target, searched up to four times
// p's (MemoryFraction is non-decreasing in the local batch); 0 when none
// is.
func (e *SimEvaluator) maxLBS(p Point, target float64) int {
	fits := func(lbs int) bool {
		q := p
		q.LBS = lbs
		m, err := e.MemoryFraction(q) // a local batch the layout refuses does not fit
		return err == nil && m <= target
	}
	lo, hi := 0, 4*p.LBS // fits(lo) holds (vacuously at 0); find the last lbs ≤ hi that fits
	for lo < hi {
		if mid := (lo + hi + 1) / 2; fits(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// WriteKnobs prints effects (KnobEffects) as a table, the plan first.
func WriteKnobs(w io.Writer, effects []KnobEffect) {
	fmt.Fprintln(w, "what each setting would change for the best plan (same layout, checkpointing, local batch and accumulation;")
	fmt.Fprintln(w, "TPS with its 90% interval; max lbs: the largest local batch within the memory target):")
	fmt.Fprintf(w, "  %-34s %8s %15s %8s %7s %5s %8s\n", "setting", "TPS", "interval", "change", "memory", "fits", "max lbs")
	for _, k := range effects {
		if k.Refused != "" {
			fmt.Fprintf(w, "  %-34s refused: %s\n", k.Setting, firstLine(k.Refused))
			continue
		}
		change := fmt.Sprintf("%+.1f%%", 100*k.TPSChange)
		if k.Setting == effects[0].Setting {
			change = "-"
		}
		fmt.Fprintf(w, "  %-34s %8.0f %7.0f–%-7.0f %8s %6.1f%% %5s %8d\n", k.Setting, k.TPS, k.TPSInterval[0], k.TPSInterval[1],
			change, 100*k.MemoryFraction, map[bool]string{true: "yes", false: "NO"}[k.Fits], k.MaxLBS)
	}
}

func firstLine(s string) string { return strings.SplitN(s, "\n", 2)[0] }

// StackAdmit is admit (nil: every point) behind the simulator's refusals
// of run's stack settings at each point's layout (sim.CheckStack) and the
// memory model's at its layout and checkpointing (memory.CheckOptions): a
// search over CUDA graphs, fused QKV or DeepEP skips the points the
// simulator cannot price (graphs with a pipeline, full graphs with expert
// parallelism, an ep DeepEP has no buffer config for), and one of
// Megatron-Core's TE blocks or AutoModel's the policies they do not run
// (torchtitan's per-op selective checkpointing), instead of failing.
func StackAdmit(run job.Spec, admit func(Point) error) func(Point) error {
	return func(p Point) error {
		s := run
		s.Layout = p.Layout
		if err := sim.CheckStack(s); err != nil {
			return err
		}
		if err := memory.CheckOptions(p.Layout, memory.OptionsOf(run.Recipe, p.AC)); err != nil {
			return err
		}
		if admit != nil {
			return admit(p)
		}
		return nil
	}
}
