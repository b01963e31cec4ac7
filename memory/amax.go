package memory

import (
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/job"
)

// amaxHistoryBytes is the FP32 amax histories a rank holding units keeps
// under recipe r (job.Recipe.DelayedGEMMs: fp8-delayed only).
func amaxHistoryBytes(r job.Recipe, cfg *moe.Config, l job.Layout, units []Unit) int64 {
	return r.DelayedGEMMs(cfg, l, UnitLayers(units)) * (job.AmaxForward + job.AmaxBackward) * job.AmaxHistoryLen * 4
}

// UnitLayers lists the layers of units.
func UnitLayers(units []Unit) []int {
	out := make([]int, len(units))
	for i, u := range units {
		out[i] = u.Layer
	}
	return out
}

// withAmaxHistories inserts the amax histories of o.Delayed into a step's
// events, in setup after the parameters (TransformerEngine allocates them
// when a module is built); events unchanged under other recipes.
func withAmaxHistories(o Options, cfg *moe.Config, l job.Layout, units []Unit, events []Event) []Event {
	bytes := amaxHistoryBytes(o.Delayed, cfg, l, units)
	if bytes == 0 {
		return events
	}
	k := 0
	for k < len(events) && events[k].Phase == Setup && events[k].Category == CatParams {
		k++
	}
	out := make([]Event, 0, len(events)+1)
	out = append(out, events[:k]...)
	out = append(out, Event{Phase: Setup, Micro: -1, Layer: moe.LayerEmbed, Label: "amax_history", Alloc: true,
		Bytes: bytes, Category: CatParams, Stream: ComputeStream})
	return append(out, events[k:]...)
}
