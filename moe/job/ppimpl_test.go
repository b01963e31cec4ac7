package job

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestLayoutPPImpl: torch (the default, stored as "") and megatron are
// accepted; megatron needs pp > 1, Megatron-Core's 1F1B or interleaved
// schedule, whole weights in the stages (zero1 or ddp) and, interleaved,
// a multiple of pp micro-batches; JSON carries pp_impl only when set.
func TestLayoutPPImpl(t *testing.T) {
	l := Layout{GPUs: 8, PP: 4, Sharding: ShardZeRO1, PPImpl: PPTorch}
	if err := l.Resolve(); err != nil || l.PPImpl != "" {
		t.Errorf("torch: err %v, impl %q (want the default, \"\")", err, l.PPImpl)
	}
	good := Layout{GPUs: 8, PP: 4, Sharding: ShardZeRO1, PPSchedule: PPInterleaved1F1B, PPImpl: PPMegatron}
	if err := good.Resolve(); err != nil {
		t.Fatalf("megatron interleaved: %v", err)
	}
	for _, c := range []struct {
		l    Layout
		want string
	}{
		{Layout{GPUs: 8, PP: 4, Sharding: ShardZeRO1, PPImpl: "deepspeed"}, "must be torch or megatron"},
		{Layout{GPUs: 8, Sharding: ShardZeRO1, PPImpl: PPMegatron}, "a pipeline option needs pp > 1"},
		{Layout{GPUs: 8, PP: 4, Sharding: ShardZeRO1, PPSchedule: PPGPipe, PPImpl: PPMegatron}, "1F1B or Interleaved1F1B"},
		{Layout{GPUs: 8, PP: 4, Sharding: ShardZeRO1, PPSchedule: PPZBVZeroBubble, PPImpl: PPMegatron}, "not ZBVZeroBubble"},
		{Layout{GPUs: 8, PP: 4, PPImpl: PPMegatron}, "zero1 or ddp"},
		{Layout{GPUs: 8, PP: 4, Sharding: ShardZeRO2, PPImpl: PPMegatron}, "not zero2"},
	} {
		err := c.l.Resolve()
		if err == nil || !strings.Contains(err.Error(), "pp_impl") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err = %v, want one naming pp_impl and %q", c.l, err, c.want)
		}
	}
	// Megatron's interleaved schedule: groups of pp micro-batches
	// (schedules.py 975-995 with the default group size pp). 6 micro-batches
	// over pp 4 pass PyTorch's rounds (max(1, 6 ÷ 4) = 1) but not Megatron.
	if _, err := good.Microbatches(6); err == nil || !strings.Contains(err.Error(), "Megatron-Core's interleaved schedule needs a multiple of pp = 4") {
		t.Errorf("megatron interleaved, 6 micro-batches over pp 4: %v", err)
	}
	if m, err := good.Microbatches(8); m != 8 || err != nil {
		t.Errorf("megatron interleaved, 8 micro-batches over pp 4: %d, %v", m, err)
	}
	if n := good.MinLBS(); n != 4 {
		t.Errorf("megatron interleaved over pp 4: smallest lbs %d, want 4", n)
	}
	torch := good
	torch.PPImpl = ""
	if _, err := torch.Microbatches(6); err != nil {
		t.Errorf("torch interleaved, 6 micro-batches over pp 4: %v", err)
	}
	b, err := json.Marshal(good)
	if err != nil || !strings.Contains(string(b), `"pp_impl":"megatron"`) {
		t.Errorf("marshalled %s, %v", b, err)
	}
	var back Layout
	if err := json.Unmarshal(b, &back); err != nil || back != good {
		t.Errorf("round trip: %+v, %v; want %+v", back, err, good)
	}
	if b, _ := json.Marshal(torch); strings.Contains(string(b), "pp_impl") {
		t.Errorf("torch layout marshals pp_impl: %s", b)
	}
	// A stage's own layout has no pipeline, hence no pipeline option.
	if s := good.StageLayout(); s.PPImpl != "" || s.Validate() != nil {
		t.Errorf("stage layout %+v: %v", s, s.Validate())
	}
}

// TestMegatronWarmup: Megatron-Core's warm-up forwards, by hand from
// get_pp_rank_microbatches, and the orders PipelineOrder gives: the most
// forwards a rank holds is the warm-up plus the first steady forward (all
// of them when every forward is in the warm-up).
//   - Interleaved, pp 2, v 2, m 4: rank 0 (2 − 0 − 1)·2 + 1·2 = 4, rank 1
//     0 + 2 = 2 (TestPipelineOrder's in-flight 5 and 3).
//   - Interleaved, pp 4, v 2, m 8: ranks 0-3 6 + 4, 4 + 4, 2 + 4, 0 + 4.
//   - Interleaved, pp 8, v 3, m 256 (R108): rank 0 14 + 16 = 30, rank 7
//     16; 1F1B pp 4, m 8: 3, 2, 1, 0; m 2: min(3, 2) = 2 on rank 0.
func TestMegatronWarmup(t *testing.T) {
	for _, c := range []struct {
		s        PPSchedule
		pp, v, m int
		want     []int
	}{
		{PPInterleaved1F1B, 2, 2, 4, []int{4, 2}},
		{PPInterleaved1F1B, 4, 2, 8, []int{10, 8, 6, 4}},
		{PPInterleaved1F1B, 8, 3, 256, []int{30, 28, 26, 24, 22, 20, 18, 16}},
		{PP1F1B, 4, 1, 8, []int{3, 2, 1, 0}},
		{PP1F1B, 4, 1, 2, []int{2, 2, 1, 0}},
	} {
		order, err := PipelineOrder(c.s, c.pp, c.v, c.m)
		if err != nil {
			t.Fatal(err)
		}
		for r, w := range c.want {
			if got := MegatronWarmup(c.s, r, c.pp, c.v, c.m); got != w {
				t.Errorf("%s pp %d v %d m %d rank %d: warm-up %d, want %d", c.s, c.pp, c.v, c.m, r, got, w)
			}
			held := min(w+1, c.v*c.m)
			if got := InFlight(order[r]); got != held {
				t.Errorf("%s pp %d v %d m %d rank %d: %d in flight, Megatron holds %d", c.s, c.pp, c.v, c.m, r, got, held)
			}
		}
	}
}
