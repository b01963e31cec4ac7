package hf

import (
	"fmt"
	"math"

	"github.com/moescope/moescope/moe"
)

// RoPE's keys: rope_theta, partial_rotary_factor and the rope_parameters
// (transformers ≥ 5) or rope_scaling object, with YaRN's parameters.

// hfRope is rope_parameters or rope_scaling; older configs name the type
// "type" instead of "rope_type".
type hfRope struct {
	RopeTheta    *float64 `json:"rope_theta"`
	RopeType     string   `json:"rope_type"`
	Type         string   `json:"type"`
	Factor       *float64 `json:"factor"`         // yarn
	MScaleAllDim *float64 `json:"mscale_all_dim"` // yarn, DeepSeek's softmax-scale correction
	// yarn's frequency blend and cos/sin factor (moe.Yarn)
	MScale          *float64 `json:"mscale"`
	AttentionFactor *float64 `json:"attention_factor"`
	BetaFast        *float64 `json:"beta_fast"`
	BetaSlow        *float64 `json:"beta_slow"`
	OriginalMaxPos  *int     `json:"original_max_position_embeddings"`
	Truncate        *bool    `json:"truncate"`
}

// scaling returns the rope type when it rescales frequencies, else "".
func (r *hfRope) scaling() string {
	if r == nil {
		return ""
	}
	t := r.RopeType
	if t == "" {
		t = r.Type
	}
	if t == "default" {
		return ""
	}
	return t
}

// rope fills RoPE's base, scaling type and rotated fraction, and YaRN's
// parameters.
func (h *configJSON) rope(c *moe.Config, def hfDefault, e *hfErrors) {
	c.RotaryFraction = opt(h.PartialRotaryFactor, def.rotary)
	c.RopeTheta = def.ropeTheta
	if h.RopeParameters != nil && h.RopeParameters.RopeTheta != nil {
		c.RopeTheta = *h.RopeParameters.RopeTheta
	}
	if h.RopeTheta != nil {
		c.RopeTheta = *h.RopeTheta
	}
	r, key := h.RopeScaling, "rope_scaling"
	c.RopeScaling = h.RopeScaling.scaling()
	if t := h.RopeParameters.scaling(); t != "" {
		r, key, c.RopeScaling = h.RopeParameters, "rope_parameters", t
	}
	if c.RopeScaling == "yarn" {
		c.Yarn = r.yarn(key, h.MaxPositions, e)
	}
}

// yarn reads YaRN's keys as _compute_yarn_parameters does (transformers
// 26892c16, see moe.Yarn): factor is required; beta_fast and beta_slow
// default to 32 and 1 (also when 0: the code reads them with `or`);
// original_max_position_embeddings defaults to max_position_embeddings;
// truncate to true; attention_factor, when absent, is
// m(factor, mscale)/m(factor, mscale_all_dim) when both are non-zero, else
// m(factor, 1), with m(s, k) = 0.1·k·ln s + 1 for s > 1 and 1 otherwise.
// Transformers 89539b06 instead replaced factor by max_position_embeddings ÷
// original_max_position_embeddings whenever the latter is given; the two
// agree on every built-in (DeepSeek-V3 163840/4096 = 40, Kimi-K2
// 131072/4096 = 32, DeepSeek-V2-Lite 40).
func (r *hfRope) yarn(key string, maxPos *int, e *hfErrors) *moe.Yarn {
	if r.Factor == nil {
		*e = append(*e, fmt.Errorf("%s.factor: required key is missing (rope_type yarn)", key))
		return nil
	}
	y := &moe.Yarn{Factor: *r.Factor, BetaFast: 32, BetaSlow: 1, Truncate: opt(r.Truncate, true)}
	if r.BetaFast != nil && *r.BetaFast != 0 {
		y.BetaFast = *r.BetaFast
	}
	if r.BetaSlow != nil && *r.BetaSlow != 0 {
		y.BetaSlow = *r.BetaSlow
	}
	switch {
	case r.OriginalMaxPos != nil:
		y.OriginalMaxPositions = *r.OriginalMaxPos
	case maxPos != nil:
		y.OriginalMaxPositions = *maxPos
	default:
		*e = append(*e, fmt.Errorf("%s.original_max_position_embeddings: required key is missing (rope_type yarn; nor is max_position_embeddings given)", key))
	}
	m := func(s, k float64) float64 {
		if s <= 1 {
			return 1
		}
		return 0.1*k*math.Log(s) + 1
	}
	switch {
	case r.AttentionFactor != nil:
		y.AttentionFactor = *r.AttentionFactor
	case r.MScale != nil && *r.MScale != 0 && r.MScaleAllDim != nil && *r.MScaleAllDim != 0:
		y.AttentionFactor = m(y.Factor, *r.MScale) / m(y.Factor, *r.MScaleAllDim)
	default:
		y.AttentionFactor = m(y.Factor, 1)
	}
	return y
}
