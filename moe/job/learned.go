package job

import (
	"math"

	"github.com/moescope/moescope/internal/band"
	"github.com/moescope/moescope/internal/stats"
)

// LearnedSkew is the expected rows of the most loaded expert-parallel rank
// ÷ the mean in one MoE layer and micro-batch under a learned router whose
// experts' loads spread with relative standard deviation routerCV (1
// without routed experts or expert parallelism).
//
// The mechanism: a rank's rows are the sum of its E/ep experts' rows, out
// of the ep·T·k (token, slot) rows its EP group routes (T tokens per rank,
// RoutedTokens). Two things spread them. The router's preference for some
// experts, independent across experts: relative variance c²·ep/E for a
// sum of E/ep of them. The sampling of T·k rows per rank, multinomial over
// ep ranks: (1 − 1/ep)/(T·k) — all there is under Megatron's forced
// balancing, which draws random logits (marin-community/marin #7668
// measured 1.013× on average at EP 64). With many rows per rank the load
// is near normal, so the most loaded of ep ranks lies E[max of ep standard
// normals] standard deviations above the mean; the layout's bound
// (MaxExpertSkew) caps it.
func (s Spec) LearnedSkew(routerCV float64) float64 {
	cfg := s.Model
	if cfg == nil || !cfg.IsMoE() || s.EP <= 1 {
		return 1
	}
	ep, rows := float64(s.EP), float64(s.RoutedTokens())*float64(cfg.TopK)
	v := routerCV * routerCV * ep / float64(cfg.Experts)
	if rows > 0 {
		v += (1 - 1/ep) / rows
	}
	return math.Min(1+stats.ExpectedMaxNormal(s.EP)*math.Sqrt(v), max(s.MaxExpertSkew(), 1))
}

// RoutedSkew is the most loaded expert-parallel rank's rows ÷ the mean the
// run's routing gives: LearnedSkew at the stored router spread
// (band.Stored.RouterCV) for learned routing, ExpertSkew otherwise (a
// counts file's load is the simulator's to read).
func (s Spec) RoutedSkew() float64 {
	if s.Routing == RoutingLearned {
		return s.LearnedSkew(band.Uncalibrated().RouterCV)
	}
	return s.ExpertSkew
}

// RoutedTokens is the tokens one rank routes per micro-batch (what an
// expert-parallel dispatcher moves at once): the
// micro-batch's sequences (the pipeline's micro-batch, or the local batch
// of one micro-step), each the rank's share of the sequence — a cp-th
// under context parallelism, a tp-th where the sequence-parallel region
// feeds the router.
func (s Spec) RoutedTokens() int64 {
	mb := int64(s.LBS)
	if s.Stages() > 1 {
		mb = int64(max(s.PPMicrobatchSize, 1))
	}
	return mb * int64(s.Seq) / int64(s.CPDegree()*max(s.TP, 1))
}
