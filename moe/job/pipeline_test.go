package job

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func orderString(as []PipeAction) string {
	parts := make([]string, len(as))
	for i, a := range as {
		parts[i] = a.String()
	}
	return strings.Join(parts, " ")
}

// TestPipelineOrder compares each rank's order with orders derived by hand
// from PyTorch's schedule definitions (schedules.py at 00722e64, see
// pipeline.go): Schedule1F1B's warm-up of min(m, pp − r) forwards then
// 1B1F; ScheduleGPipe's fill-drain; ScheduleInterleaved1F1B's
// _get_warmup_ops and forward/backward_stage_index stepped through with
// pp 2, v 2, m 4 (rounds 2, 2 micro-batches per round; warm-up 4 on rank
// 0, 2 on rank 1); ScheduleInterleavedZeroBubble's the same way (warm-up
// (v − 1)·2 + (pp − 1 − r): 3 on rank 0, 2 on rank 1; each input pass
// from the (r + 1)-th on followed by the oldest waiting weight pass, the
// rest at the end); ScheduleZBVZeroBubble's
// _calculate_single_rank_operations stepped through with pp 2, m 3
// (n = max(2·2 − 1, 3) = 3; rank 0 holds stages 0 and 3, rank 1 stages 1
// and 2; rank 0: warm-up 3 forwards of stage 0, no pairs, 2 triples of
// stage 3, one steady round, cool-down 2 (I, W) pairs of stage 0; rank 1:
// 1 forward, 1 pair, 1 triple, one steady round, one (I, I) pair, one
// (I, W) pair of stage 1, then stage 2's waiting W, then stage 1's);
// ScheduleDualPipeV's stepped through with pp 2, m 4 (rank 0, stages 0
// and 3: steps 1-8 give 2, 1, 1, 1, 1, 1, 1, 1 rounds: 0F0 0F1 | 0F2 3F0 |
// 3I0 3W0 3F1 | 0F3 3B1 3F2 0B0 | 3B2 3F3 0B1 | 3B3, switch, 0I2 | 0W2
// 0I3 | 0W3; rank 1, stages 1 and 2: 0, 2, 0, 2, 0, 2, 0, 2 rounds: 1F0 2F0
// 1F1 2F1 | 1F2 2B0 2F2 1B0 1F3 2B1 2F3 1B1 | 2B2 1B2, switch at i = 1
// before chunk 1, 2I3 1I3 | 2W3 1W3). In flight: forwards whose B or W
// has not run.
func TestPipelineOrder(t *testing.T) {
	for _, c := range []struct {
		s        PPSchedule
		pp, v, m int
		want     []string
		inFlight []int
	}{
		{PP1F1B, 4, 1, 8, []string{
			"0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7",
			"1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7",
			"2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7",
			"3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7",
		}, []int{4, 3, 2, 1}},
		// Fewer micro-batches than stages: warm-up is capped at m.
		{PP1F1B, 4, 1, 2, []string{"0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1", "2F0 2F1 2B0 2B1", "3F0 3B0 3F1 3B1"}, []int{2, 2, 2, 1}},
		{PPGPipe, 2, 1, 3, []string{"0F0 0F1 0F2 0B0 0B1 0B2", "1F0 1F1 1F2 1B0 1B1 1B2"}, []int{3, 3}},
		{PPInterleaved1F1B, 2, 2, 4, []string{
			"0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
			"1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
		}, []int{5, 3}},
		{PPInterleavedZeroBubble, 2, 2, 4, []string{
			"0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 2F3 2I2 2W2 2I3 2W3 0I2 0W2 0I3 0W3",
			"1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 1I3 1W2 1W3",
		}, []int{4, 4}},
		{PPZBVZeroBubble, 2, 2, 3, []string{
			"0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 3F2 3I2 3W2 0I1 0W1 0I2 0W2",
			"1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1I1 2I2 1I2 1W1 2W2 1W2",
		}, []int{4, 4}},
		{PPDualPipeV, 2, 2, 4, []string{
			"0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3 3B1 3F2 0B0 3B2 3F3 0B1 3B3 0I2 0W2 0I3 0W3",
			"1F0 2F0 1F1 2F1 1F2 2B0 2F2 1B0 1F3 2B1 2F3 1B1 2B2 1B2 2I3 1I3 2W3 1W3",
		}, []int{5, 5}},
	} {
		name := fmt.Sprintf("%s/pp%d/v%d/m%d", c.s, c.pp, c.v, c.m)
		got, err := PipelineOrder(c.s, c.pp, c.v, c.m)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for r := range c.want {
			if s := orderString(got[r]); s != c.want[r] {
				t.Errorf("%s rank %d:\n got %s\nwant %s", name, r, s, c.want[r])
			}
			if n := InFlight(got[r]); n != c.inFlight[r] {
				t.Errorf("%s rank %d: in flight %d, want %d", name, r, n, c.inFlight[r])
			}
		}
	}
}

// TestPipelineOrderRuns walks every order with unit-time actions and the
// pipeline's data dependencies (a forward after the previous stage's
// forward of its micro-batch, a backward after the next stage's backward,
// the last stage's backward after its own forward): every (stage,
// micro-batch) runs forward and backward exactly once on its own rank and
// no rank waits forever.
func TestPipelineOrderRuns(t *testing.T) {
	for _, s := range PPSchedules() {
		for pp := 1; pp <= 5; pp++ {
			vs := []int{1}
			switch {
			case s.VShaped():
				vs = []int{2}
			case s.MultiStage():
				vs = []int{2, 3}
			}
			for _, v := range vs {
				for m := 1; m <= 12; m++ {
					order, err := PipelineOrder(s, pp, v, m)
					if err != nil {
						if (s == PPInterleaved1F1B || s == PPInterleavedZeroBubble) && m%max(1, m/pp) != 0 || s == PPDualPipeV && m < 2*pp {
							continue
						}
						t.Fatalf("%s pp %d v %d m %d: %v", s, pp, v, m, err)
					}
					if err := walkOrder(order, s, pp, v, m); err != nil {
						t.Errorf("%s pp %d v %d m %d: %v", s, pp, v, m, err)
					}
				}
			}
		}
	}
}

// walkOrder checks that order places every action on its stage's rank
// (looped, or V-shaped for V schedules), runs every (stage, micro-batch)'s
// forward once and its backward once, as one B or as an I then a W, ends
// each stage's micro-batches in order, and
// that unit-time steps with the data dependencies (a forward after the
// previous stage's, a backward or input pass after the next stage's or on
// the last stage after its own forward, a weight pass after its own input
// pass) reach the end.
func walkOrder(order [][]PipeAction, s PPSchedule, pp, v, m int) error {
	n := pp * v
	done := map[PipeAction]bool{}
	seen := map[PipeAction]bool{}
	weights := 0
	for r, as := range order {
		for _, a := range as {
			if seen[a] || stageRank(s, pp, a.Stage) != r || a.Micro < 0 || a.Micro >= m || a.Stage >= n {
				return fmt.Errorf("rank %d: action %s repeated or misplaced", r, a)
			}
			seen[a] = true
			if a.Kind == PipeW {
				weights++
			}
		}
	}
	// Each stage ends its micro-batches (B or W) in micro-batch order: the
	// memory timeline allocates the accumulated gradients at micro-batch 0
	// and reduces them at m − 1.
	for r, as := range order {
		ended := map[int]int{}
		for _, a := range as {
			if a.Frees() {
				if a.Micro != ended[a.Stage] {
					return fmt.Errorf("rank %d: %s ends micro-batch %d of stage %d before %d", r, a, a.Micro, a.Stage, ended[a.Stage])
				}
				ended[a.Stage]++
			}
		}
	}
	for st := range n {
		for mb := range m {
			f, b := seen[PipeAction{PipeF, st, mb}], seen[PipeAction{PipeB, st, mb}]
			i, w := seen[PipeAction{PipeI, st, mb}], seen[PipeAction{PipeW, st, mb}]
			if !f || b == (i && w) || i != w {
				return fmt.Errorf("stage %d micro-batch %d: F %v, B %v, I %v, W %v: want F and either B or I and W", st, mb, f, b, i, w)
			}
		}
	}
	done2 := func(k PipeKind, st, mb int) bool { return done[PipeAction{k, st, mb}] }
	ready := func(a PipeAction) bool {
		switch {
		case a.Kind == PipeF:
			return a.Stage == 0 || done2(PipeF, a.Stage-1, a.Micro)
		case a.Kind == PipeW:
			return done2(PipeI, a.Stage, a.Micro)
		case a.Stage == n-1:
			return done2(PipeF, a.Stage, a.Micro)
		}
		return done2(PipeB, a.Stage+1, a.Micro) || done2(PipeI, a.Stage+1, a.Micro)
	}
	next := make([]int, pp)
	for left := len(seen); left > 0; {
		var step []PipeAction
		for r := range order {
			if next[r] < len(order[r]) && ready(order[r][next[r]]) {
				step = append(step, order[r][next[r]])
				next[r]++
			}
		}
		if len(step) == 0 {
			return fmt.Errorf("deadlock with %d actions left (next %v)", left, next)
		}
		for _, a := range step {
			done[a] = true
		}
		left -= len(step)
	}
	return nil
}

func TestPipelineOrderErrors(t *testing.T) {
	for _, c := range []struct {
		s        PPSchedule
		pp, v, m int
		want     string
	}{
		{"LoopedBFS", 2, 2, 4, "not built yet; built: one of [GPipe 1F1B Interleaved1F1B InterleavedZeroBubble ZBVZeroBubble DualPipeV]"},
		{"1f1b", 2, 1, 4, "must be one of [GPipe 1F1B Interleaved1F1B InterleavedZeroBubble ZBVZeroBubble DualPipeV]"},
		{PPDualPipeV, 2, 2, 3, "needs at least as many as stages, 2·pp = 4"},
		{PPDualPipeV, 2, 3, 4, "V-shaped schedules take exactly 2"},
		{PPZBVZeroBubble, 2, 3, 4, "V-shaped schedules take exactly 2"},
		{PPInterleavedZeroBubble, 2, 1, 4, "multi-stage ones at least 2"},
		{PPInterleavedZeroBubble, 4, 2, 9, "multiple of its rounds max(1, m ÷ pp) = 2"},
		{PP1F1B, 2, 2, 4, "single-stage schedules take 1"},
		{PPInterleaved1F1B, 2, 1, 4, "multi-stage ones at least 2"},
		{PPInterleaved1F1B, 4, 2, 10, "multiple of its rounds max(1, m ÷ pp) = 2"}, // PyTorch's example 1 allows 10 (rounds 2): 10 % 2 = 0
		{PPInterleaved1F1B, 4, 2, 9, "multiple of its rounds max(1, m ÷ pp) = 2"},
		{PP1F1B, 0, 1, 4, "need pp, v ≥ 1"},
		{PP1F1B, 2, 1, 0, "need pp, v ≥ 1"},
	} {
		_, err := PipelineOrder(c.s, c.pp, c.v, c.m)
		if c.m == 10 {
			// PyTorch's docstring: pp 4, m 10 works (rounds 2).
			if err != nil {
				t.Errorf("%s pp %d m 10: %v, want accepted", c.s, c.pp, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s pp %d v %d m %d: error %v, want it to contain %q", c.s, c.pp, c.v, c.m, err, c.want)
		}
	}
}

// TestStageSplit checks torchtitan's default split against splits derived
// by hand from generate_llm_fqn_per_model_part (pipeline.go): effective
// layers = layers + 2, spread evenly with the remainder to the first
// stages, minus one on the first and the last stage.
func TestStageSplit(t *testing.T) {
	for _, c := range []struct {
		l      Layout
		layers int
		want   []int
	}{
		{Layout{PP: 4, PPSchedule: PP1F1B, PPVirtualStages: 1}, 8, []int{2, 3, 2, 1}},              // 10 = 3+3+2+2
		{Layout{PP: 8, PPSchedule: PP1F1B, PPVirtualStages: 1}, 48, []int{6, 7, 6, 6, 6, 6, 6, 5}}, // 50 = 2·7 + 6·6
		{Layout{PP: 2, PPSchedule: PPInterleaved1F1B, PPVirtualStages: 2}, 4, []int{1, 2, 1, 0}},   // 6 = 2+2+1+1
		{Layout{}, 7, []int{7}},
		{Layout{PP: 2, PPSchedule: PP1F1B, PPVirtualStages: 1, PPLayers: "3,4"}, 7, []int{3, 4}},
	} {
		got, err := c.l.StageSplit(c.layers)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%+v, %d layers: %v, %v; want %v", c.l, c.layers, got, err, c.want)
		}
	}
	for _, c := range []struct {
		l      Layout
		layers int
		want   string
	}{
		{Layout{PP: 4, PPSchedule: PP1F1B, PPVirtualStages: 1}, 1, "needs at least one effective layer per stage"}, // 3 effective layers over 4 stages
		{Layout{PP: 2, PPSchedule: PP1F1B, PPVirtualStages: 1, PPLayers: "3,3"}, 7, "must sum to the model's 7 layers (sums to 6)"},
		{Layout{PP: 2, PPSchedule: PPInterleaved1F1B, PPVirtualStages: 2, PPLayers: "3,0,0,4"}, 7, "stage 1 holds no layer"},
	} {
		if _, err := c.l.StageSplit(c.layers); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v, %d layers: %v, want %q", c.l, c.layers, err, c.want)
		}
	}
}

func TestLayoutPipelineResolve(t *testing.T) {
	for _, c := range []struct {
		in, want Layout
	}{
		{Layout{GPUs: 16, PP: 4}, Layout{GPUs: 16, PP: 4, DPShard: 4, DPReplicate: 1, EP: 1, TP: 1, ETP: 1, Sharding: ShardFSDP, PPSchedule: PP1F1B, PPMicrobatchSize: 1, PPVirtualStages: 1}},
		{Layout{GPUs: 16, PP: 2, DPReplicate: 2, PPSchedule: PPInterleaved1F1B}, Layout{GPUs: 16, PP: 2, DPShard: 4, DPReplicate: 2, EP: 1, TP: 1, ETP: 1, Sharding: ShardFSDP, PPSchedule: PPInterleaved1F1B, PPMicrobatchSize: 1, PPVirtualStages: 2}},
		{Layout{DPShard: 2, PP: 8, PPSchedule: PPInterleaved1F1B, PPLayers: "2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2"}, Layout{GPUs: 16, PP: 8, DPShard: 2, DPReplicate: 1, EP: 1, TP: 1, ETP: 1, Sharding: ShardFSDP, PPSchedule: PPInterleaved1F1B, PPMicrobatchSize: 1, PPVirtualStages: 3, PPLayers: "2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2"}},
		{Layout{GPUs: 8, DPShard: 2, PP: 2}, Layout{GPUs: 8, PP: 2, DPShard: 2, DPReplicate: 2, EP: 1, TP: 1, ETP: 1, Sharding: ShardFSDP, PPSchedule: PP1F1B, PPMicrobatchSize: 1, PPVirtualStages: 1}},
	} {
		got := c.in
		if err := got.Resolve(); err != nil || got != c.want {
			t.Errorf("Resolve(%+v) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	for _, c := range []struct {
		in   Layout
		want []string
	}{
		{Layout{GPUs: 16, PP: 4, DPShard: 2, DPReplicate: 3}, []string{"pp × dp_replicate × dp_shard × tp = 4 × 3 × 2 × 1 ≠ gpus = 16"}},
		{Layout{GPUs: 12, PP: 8}, []string{"gpus = 12 is not divisible by pp × dp_replicate × tp = 8 × 1 × 1 = 8"}},
		{Layout{GPUs: 8, PP: 2, DPShard: 3}, []string{"gpus = 8 is not divisible by pp × dp_shard × tp = 2 × 3 × 1 = 6"}},
		{Layout{GPUs: 8, PP: 2, EP: 3}, []string{"ep = 3 does not divide dp_shard = 4 (gpus = 8 = pp 2 × dp_replicate 1 × dp_shard 4)"}},
		{Layout{GPUs: 8, PP: -1}, []string{"pp = -1"}},
		{Layout{GPUs: 8, PP: 2, PPSchedule: "LoopedBFS"}, []string{"pp_schedule = LoopedBFS: torchtitan's schedule is not built yet; built: one of [GPipe 1F1B Interleaved1F1B InterleavedZeroBubble ZBVZeroBubble DualPipeV]"}},
		{Layout{GPUs: 8, PP: 2, PPSchedule: PPDualPipeV, PPVirtualStages: 4}, []string{"pp_virtual_stages = 4: must be 2 for the V-shaped schedule DualPipeV"}},
		{Layout{GPUs: 8, PP: 2, PPSchedule: PPZBVZeroBubble, PPVirtualStages: 3}, []string{"pp_virtual_stages = 3: must be 2 for the V-shaped schedule ZBVZeroBubble (rank r holds stages r and 2·pp − 1 − r; pp = 2)"}},
		{Layout{GPUs: 8, PP: 2, PPSchedule: PPZBVZeroBubble, PPLayers: "1,1,1,1,1,1"}, []string{"pp_virtual_stages = 3: must be 2 for the V-shaped schedule"}},
		{Layout{GPUs: 8, PP: 2, PPSchedule: PP1F1B, PPVirtualStages: 2}, []string{"pp_virtual_stages = 2: must be 1 for the single-stage schedule 1F1B"}},
		{Layout{GPUs: 8, PP: 2, PPSchedule: PPInterleaved1F1B, PPVirtualStages: 1}, []string{"must be ≥ 2 for the multi-stage schedule Interleaved1F1B"}},
		{Layout{GPUs: 8, PP: 2, PPLayers: "1,2,3"}, []string{"pp_layers has 3 stages, not a multiple of pp = 2"}},
		{Layout{GPUs: 8, PP: 2, PPVirtualStages: 1, PPLayers: "1,2,3,4"}, []string{"must list pp × pp_virtual_stages = 2 × 1 = 2 stages"}},
		{Layout{GPUs: 8, PPSchedule: PPGPipe, PPMicrobatchSize: 2}, []string{"pp_schedule = GPipe: a pipeline option needs pp > 1", "pp_microbatch_size = 2: a pipeline option needs pp > 1"}},
		{Layout{GPUs: 8, PP: 2, PPMicrobatchSize: -1}, []string{"pp_microbatch_size = -1: must be in [1, 65536]"}},
		{Layout{GPUs: 8, PP: 2, PPLayers: "1,x"}, []string{`stage 1 = "x"`}},
		{Layout{GPUs: 8, PP: 2, GradSyncLastOnly: true}, []string{"grad_sync_last_only = true: not modelled with pp > 1"}},
		{Layout{GPUs: 8, PP: 2, TP: 2, DPShard: 3}, []string{"gpus = 8 is not divisible by pp × dp_shard × tp = 2 × 3 × 2 = 12"}},
		{Layout{GPUs: 8, PP: 2, TP: 4, DPReplicate: 2}, []string{"gpus = 8 is not divisible by pp × dp_replicate × tp = 2 × 2 × 4 = 16"}},
	} {
		l := c.in
		err := l.Resolve()
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("Resolve(%+v): %v; want it to contain %q", c.in, err, w)
			}
		}
	}
}

func TestLayoutMicrobatches(t *testing.T) {
	l := Layout{GPUs: 8, PP: 4}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	l.PPMicrobatchSize = 2
	if m, err := l.Microbatches(8); m != 4 || err != nil {
		t.Errorf("lbs 8 ÷ mbs 2 = %d, %v; want 4", m, err)
	}
	if _, err := l.Microbatches(7); err == nil || !strings.Contains(err.Error(), "lbs = 7 is not a multiple of pp_microbatch_size = 2") {
		t.Errorf("lbs 7: %v", err)
	}
	l.PPSchedule, l.PPVirtualStages, l.PPMicrobatchSize = PPInterleaved1F1B, 2, 1
	if _, err := l.Microbatches(9); err == nil || !strings.Contains(err.Error(), "rounds max(1, micro-batches ÷ pp) = 2") {
		t.Errorf("interleaved m 9 over pp 4: %v", err)
	}
	l.PPSchedule = PPDualPipeV
	if _, err := l.Microbatches(7); err == nil || !strings.Contains(err.Error(), "DualPipeV needs at least as many as stages, 2 × pp = 2 × 4 = 8") {
		t.Errorf("DualPipeV m 7 over pp 4: %v", err)
	}
	if m, err := l.Microbatches(8); m != 8 || err != nil {
		t.Errorf("DualPipeV m 8 over pp 4: %d, %v", m, err)
	}
	l.PPSchedule, l.PPVirtualStages = PP1F1B, 1
	if _, err := l.Microbatches(MaxMicrobatches + 1); err == nil || !strings.Contains(err.Error(), "at most 4096") {
		t.Errorf("%d micro-batches: %v", MaxMicrobatches+1, err)
	}
	if m, err := (Layout{}).Microbatches(5); m != 1 || err != nil {
		t.Errorf("no pipeline: %d, %v; want 1", m, err)
	}
}

func TestLayoutPipelineJSON(t *testing.T) {
	var l Layout
	in := `{"gpus": 16, "pp": 8, "pp_schedule": "Interleaved1F1B", "pp_microbatch_size": 1, "pp_layers": [4,6,6,6,6,6,6,6,6,6,6,6,6,6,6,5]}`
	if err := json.Unmarshal([]byte(in), &l); err != nil {
		t.Fatal(err)
	}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	if l.PPVirtualStages != 2 || l.PPLayers != "4,6,6,6,6,6,6,6,6,6,6,6,6,6,6,5" {
		t.Errorf("resolved %+v", l)
	}
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"pp_layers":[4,6,6,6,6,6,6,6,6,6,6,6,6,6,6,5]`) || !strings.Contains(string(b), `"pp":8`) {
		t.Errorf("marshalled %s", b)
	}
	// pp = 1 layouts print as before: no pipeline keys.
	b, _ = json.Marshal(DefaultLayout())
	if strings.Contains(string(b), "pp") {
		t.Errorf("default layout marshals pipeline keys: %s", b)
	}
	if err := json.Unmarshal([]byte(`{"pp_layers": "4,4"}`), &l); err == nil || !strings.Contains(err.Error(), "pp_layers: want a list of layer counts") {
		t.Errorf("pp_layers as a string: %v", err)
	}
	if err := json.Unmarshal([]byte(`{"pp_layers": [4, -1]}`), &l); err == nil || !strings.Contains(err.Error(), "each must be a layer count") {
		t.Errorf("negative count: %v", err)
	}
}

// TestStageLayoutTP: tp inside pipeline stages. 16 GPUs at pp 2 × tp 2
// leave dp_shard = 16 / (2 · 2) = 4; a stage is the mesh of dp_shard 4 ×
// tp 2 = 8 ranks with the same ep and etp (ep 8 borrowing dp_shard 4 × tp
// 2 at etp 1), which validates as a layout of its own.
func TestStageLayoutTP(t *testing.T) {
	l := Layout{GPUs: 16, PP: 2, TP: 2, EP: 8, ETP: 1}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	s := l.StageLayout()
	if l.DPShard != 4 || l.StageGPUs() != 8 || s.GPUs != 8 || s.TP != 2 || s.EP != 8 || s.ETP != 1 || s.PP != 0 {
		t.Errorf("pp 2 × tp 2 of 16: dp_shard %d, stage %+v (StageGPUs %d); want dp_shard 4 and a stage of 8 ranks at tp 2, ep 8, etp 1", l.DPShard, s, l.StageGPUs())
	}
	if err := s.Validate(); err != nil {
		t.Errorf("stage layout: %v", err)
	}
}

// TestStageRankV: torchtitan's style "v" (pipeline_parallel.py,
// _get_pp_rank_to_stage_indices_mapping) pairs rank r with stages r and
// 2·pp − 1 − r: with pp 4, ranks hold (0, 7), (1, 6), (2, 5), (3, 4);
// looped placement holds (r, r + 4).
func TestStageRankV(t *testing.T) {
	for _, c := range []struct {
		s    PPSchedule
		want [][]int
	}{
		{PPZBVZeroBubble, [][]int{{0, 7}, {1, 6}, {2, 5}, {3, 4}}},
		{PPDualPipeV, [][]int{{0, 7}, {1, 6}, {2, 5}, {3, 4}}},
		{PPInterleavedZeroBubble, [][]int{{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
	} {
		l := Layout{GPUs: 4, PP: 4, PPSchedule: c.s}
		if err := l.Resolve(); err != nil {
			t.Fatal(err)
		}
		if l.PPVirtualStages != 2 {
			t.Errorf("%s: %d virtual stages by default, want 2", c.s, l.PPVirtualStages)
		}
		for r, want := range c.want {
			if got := l.RankStages(r); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s rank %d: stages %v, want %v", c.s, r, got, want)
			}
			for _, s := range want {
				if l.StageRank(s) != r {
					t.Errorf("%s: stage %d on rank %d, want %d", c.s, s, l.StageRank(s), r)
				}
			}
		}
	}
}

// TestZBVInFlight: ZB-V holds the activation memory of 1F1B on every
// rank (the authors' README table, sail-sg/zero-bubble-pipeline-
// parallelism at 3a91d0c8c21755dd0f7b425e3ac5699ab00b4083: "Activation
// Memory (Compared to 1F1B) 1x" for ZBV; arXiv 2401.10241 §6): 1F1B's
// first rank holds pp micro-batches of its layers, a ZB-V chunk is half a
// rank's layers, so 2·pp chunk activations, the same on every rank, once
// m ≥ 2·pp − 1 fills the V.
func TestZBVInFlight(t *testing.T) {
	for pp := 2; pp <= 6; pp++ {
		for _, m := range []int{2*pp - 1, 3 * pp, 24} {
			order, err := PipelineOrder(PPZBVZeroBubble, pp, 2, m)
			if err != nil {
				t.Fatal(err)
			}
			for r, as := range order {
				if n := InFlight(as); n != 2*pp {
					t.Errorf("pp %d m %d rank %d: %d chunk activations in flight, want 2·pp = %d", pp, m, r, n, 2*pp)
				}
			}
		}
	}
}

// TestMinLBS: the smallest local batch a layout runs is one sequence
// without pp, one micro-batch under 1F1B, and under DualPipeV on pp 2
// (2·pp = 4 stages in a V) the 4 micro-batches PyTorch's schedule needs,
// 4 × pp_microbatch_size 2 = 8 sequences.
func TestMinLBS(t *testing.T) {
	for _, c := range []struct {
		l    Layout
		want int
	}{
		{Layout{}, 1},
		{Layout{PP: 2, PPSchedule: PP1F1B, PPMicrobatchSize: 2, PPVirtualStages: 1}, 2},
		{Layout{PP: 2, PPSchedule: PPDualPipeV, PPMicrobatchSize: 2, PPVirtualStages: 2}, 8},
	} {
		if got := c.l.MinLBS(); got != c.want {
			t.Errorf("%+v: MinLBS %d, want %d", c.l, got, c.want)
		}
	}
}
