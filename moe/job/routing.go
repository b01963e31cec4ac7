package job

import (
	"github.com/moescope/moescope/internal/band"
	"github.com/moescope/moescope/moe"
)

// Routing is what the run's router does with the tokens: DESIGN's
// `--routing balanced|learned|FILE`. Empty and RoutingBalanced are
// balanced routing (every expert-parallel rank receives the mean rows, or
// ExpertSkew × the mean on the most loaded one); any other value but
// RoutingLearned names a file of per-expert token counts the simulator
// replays (sim.RoutingCounts reads it).
type Routing string

// Routings.
const (
	RoutingBalanced Routing = "balanced"
	RoutingLearned  Routing = "learned"
)

// File is the counts file r names, "" for balanced or learned routing.
func (r Routing) File() string {
	if r == "" || r == RoutingBalanced || r == RoutingLearned {
		return ""
	}
	return string(r)
}

// check refuses an expert skew beside learned routing or a counts file
// (the router's statistics or the counts decide the most loaded rank), and
// learned routing while no router statistics are stored (band.Stored's
// RouterCV is fitted from published runs: see LearnedSkew).
func (r Routing) check(skew float64) error {
	switch {
	case r == RoutingLearned && band.Uncalibrated().RouterCV <= 0:
		return moe.FieldError{Field: "routing", Value: string(r), Allowed: "balanced, or a JSON file of per-expert token counts (no published router statistics are stored)"}
	case (r == RoutingLearned || r.File() != "") && skew != 0:
		return moe.FieldError{Field: "expert_skew", Value: skew, Allowed: "0 with routing " + string(r) + ": the router decides the most loaded rank"}
	}
	return nil
}
