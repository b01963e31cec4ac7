package moe

import (
	"fmt"
	"math"
)

// SwiGLUClamp is GPT-OSS's clamped SwiGLU of the routed experts. With
// g = min(gate, Limit) and u = clamp(up, −Limit, Limit),
//
//	act = (u + 1) · g · σ(Alpha·g)
//
// (GptOssExperts.forward, modeling_gpt_oss.py, transformers 00d4b3d2,
// which fixes Alpha = 1.702 and Limit = 7; configuration_gpt_oss.py at
// transformers 02b8f42b makes them the keys swiglu_alpha and swiglu_limit
// with those defaults). The plain SwiGLU silu(gate)·up is the nil clamp.
type SwiGLUClamp struct {
	Alpha float64 `json:"alpha"`
	Limit float64 `json:"limit"`
}

// validateSwiGLU checks the clamp's constants.
func (c *Config) validateSwiGLU(e *fieldErrors) {
	if c.Clamp == nil {
		return
	}
	if a := c.Clamp.Alpha; !(a > 0) || math.IsInf(a, 0) {
		e.bad("swiglu_clamp.alpha", a, "must be a finite number > 0")
	}
	if l := c.Clamp.Limit; !(l > 0) || math.IsInf(l, 0) {
		e.bad("swiglu_clamp.limit", l, fmt.Sprintf("must be a finite number > 0 (%v given)", l))
	}
}
