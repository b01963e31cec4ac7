package memory

import (
	"testing"

	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// FuzzEstimate checks the invariants of any accepted input: the timeline
// replays (every free matches a live allocation), the peak holds at least
// the persistent state, reserved ≥ allocated, and the breakdown sums to
// the peak. Bad inputs must return errors, never panic.
func FuzzEstimate(f *testing.F) {
	f.Add(uint8(0), 2, 16, 8, 8, 1, uint8(0), uint8(1), 1, 0, false, true)
	f.Add(uint8(1), 1, 7, 8, 4, 2, uint8(1), uint8(0), 3, 4, true, false)
	f.Add(uint8(1), 0, 16, 8, 8, 3, uint8(2), uint8(3), 1, 0, false, true)
	f.Add(uint8(0), 3, 5, 6, 3, 1, uint8(3), uint8(2), 2, 2, false, false)
	f.Fuzz(func(t *testing.T, model uint8, lbs, seq, gpus, shard, ep int, sharding, ac uint8, accum, chunks int, keep, reshard bool) {
		if lbs > 64 || seq > 256 || gpus > 4096 || accum > 8 || chunks > 64 {
			t.Skip()
		}
		cfg := denseCfg()
		if model%2 == 1 {
			cfg = moeCfg()
		}
		l := job.Layout{GPUs: gpus, DPShard: shard, EP: ep, KeepGathered: keep, ReshardAfterForward: reshard,
			Sharding: []job.Sharding{job.ShardFSDP, job.ShardZeRO2, job.ShardZeRO1, job.ShardDDP}[sharding%4]}
		if l.Resolve() != nil {
			return
		}
		o := Options{AC: []moe.AC{{Mode: moe.ACNone}, {Mode: moe.ACSelective}, {Mode: moe.ACFull}, {Mode: moe.ACLayer, Every: 2}}[ac%4],
			LossChunks: chunks}
		r, err := Estimate(cfg, l, Batch{LBS: lbs, Seq: seq, GradAccum: accum}, o)
		if err != nil {
			return
		}
		if r.Peak.Allocated < r.State.Params+r.State.Optimizer || r.Peak.Reserved < r.Peak.Allocated {
			t.Fatalf("peak allocated %d, reserved %d, state %+v", r.Peak.Allocated, r.Peak.Reserved, r.State)
		}
		var live int64
		for _, n := range r.Peak.Live {
			live += n
		}
		if live != r.Peak.Allocated {
			t.Fatalf("breakdown %d ≠ peak %d", live, r.Peak.Allocated)
		}
	})
}
