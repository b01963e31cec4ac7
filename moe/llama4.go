package moe

import (
	"fmt"
	"math"
	"slices"
)

// Llama 4's attention and routing (Llama4TextAttention, Llama4TextMoe and
// Llama4Router in modeling_llama4.py, transformers 000c33fd):
//
//   - Chunked attention: layer i with Chunk[i] = C > 0 lets query t see the
//     keys s ≤ t of its own chunk, ⌊s/C⌋ = ⌊t/C⌋ (layer_types
//     "chunked_attention", attention_chunk_size). Those are the layers that
//     apply RoPE; the others are NoPE layers with full causal attention.
//   - NoPE: NoRope[i] skips RoPE on layer i (no_rope_layers[i] == 0).
//   - QKNormL2Rope: q and k are divided per head by their root mean square,
//     x·rsqrt(mean(x²) + NormEps), with no weight, after RoPE and on RoPE
//     layers only (Llama4TextL2Norm when use_qk_norm).
//   - Temperature tuning on NoPE layers: the query of position p is
//     multiplied by 1 + Scale·log(1 + ⌊(p+1)/FloorScale⌋)
//     (attn_temperature_tuning, floor_scale, attn_scale; from arXiv:2501.19399).
//   - RouteInput: the router's weight σ(logit) multiplies the routed
//     expert's input row rather than its output (routed_in = x·score), so a
//     token's routed output is expert(σ·x).
//   - FusedHalves: the stacked gate_up_proj [E, D, 2F] holds gate in its
//     first F columns and up in its last F (Llama4TextExperts'
//     gate_up.chunk(2)), not interleaved as GPT-OSS's.

// QKNormL2Rope is Llama 4's weightless per-head L2 (RMS) QK-norm on the
// layers that apply RoPE.
const QKNormL2Rope QKNorm = "l2_rope"

// AttnTemperature is Llama 4's attention temperature tuning of NoPE layers.
type AttnTemperature struct {
	FloorScale int     `json:"floor_scale"`
	Scale      float64 `json:"attn_scale"`
}

// Factor is the multiplier of the query at position p (0-based).
func (a AttnTemperature) Factor(p int) float64 {
	return 1 + a.Scale*math.Log1p(math.Floor(float64(p+1)/float64(a.FloorScale)))
}

// Roped reports whether layer l applies RoPE.
func (c *Config) Roped(l int) bool { return c.NoRope == nil || !c.NoRope[l] }

// LayerQKNorm reports whether layer l normalizes q and k: every layer
// under "head" and "full", the RoPE layers under "l2_rope".
func (c *Config) LayerQKNorm(l int) bool {
	return c.QKNorm != QKNormNone && (c.QKNorm != QKNormL2Rope || c.Roped(l))
}

// LayerChunk is layer l's attention chunk (0: none).
func (c *Config) LayerChunk(l int) int {
	if c.Chunk == nil {
		return 0
	}
	return c.Chunk[l]
}

// Llama4Fields names the Llama 4 fields c sets (for a refusal by name
// where they are not run).
func (c *Config) Llama4Fields() []string {
	var set []string
	for _, f := range []struct {
		name string
		on   bool
	}{{"chunk", slices.ContainsFunc(c.Chunk, func(n int) bool { return n > 0 })}, {"no_rope", slices.Contains(c.NoRope, true)},
		{"qk_norm l2_rope", c.QKNorm == QKNormL2Rope}, {"attn_temperature", c.Temperature != nil},
		{"route_input", c.RouteInput}, {"fused_halves", c.FusedHalves}} {
		if f.on {
			set = append(set, f.name)
		}
	}
	return set
}

// RopedLayers counts the layers that apply RoPE.
func (c *Config) RopedLayers() int {
	n := 0
	for l := range c.Layers {
		if c.Roped(l) {
			n++
		}
	}
	return n
}

// validateLlama4 checks the per-layer lists and constants of Llama 4's
// fields; nil lists mean none (no chunking, RoPE everywhere).
func (c *Config) validateLlama4(e *fieldErrors) {
	if c.Layers <= 0 || c.Layers > MaxDim {
		return
	}
	if c.Chunk != nil && len(c.Chunk) != c.Layers {
		e.bad("chunk", len(c.Chunk), fmt.Sprintf("needs one entry per layer (%d) or none", c.Layers))
	}
	if c.NoRope != nil && len(c.NoRope) != c.Layers {
		e.bad("no_rope", len(c.NoRope), fmt.Sprintf("needs one entry per layer (%d) or none", c.Layers))
	}
	for i, ch := range c.Chunk {
		switch {
		case ch < 0 || ch > MaxDim:
			e.bad(fmt.Sprintf("chunk[%d]", i), ch, fmt.Sprintf("must be 0 (none) or in [1, %d]", MaxDim))
		case ch > 0 && i < len(c.Window) && c.Window[i] > 0:
			e.bad(fmt.Sprintf("chunk[%d]", i), ch, fmt.Sprintf("not with a sliding window on the same layer (window[%d] = %d)", i, c.Window[i]))
		}
	}
	if c.IsMLA() && (c.Chunk != nil || c.NoRope != nil || c.QKNorm == QKNormL2Rope) {
		e.bad("chunk, no_rope, qk_norm", "set", "not with multi-head latent attention")
	}
	if t := c.Temperature; t != nil {
		if t.FloorScale <= 0 || t.FloorScale > MaxDim {
			e.bad("attn_temperature.floor_scale", t.FloorScale, fmt.Sprintf("must be in [1, %d]", MaxDim))
		}
		if !(t.Scale >= 0) || math.IsInf(t.Scale, 0) {
			e.bad("attn_temperature.attn_scale", t.Scale, "must be a finite number ≥ 0")
		}
	}
	if c.RouteInput && c.Score != Sigmoid {
		e.bad("route_input", true, `only with score = "sigmoid" (Llama 4's router)`)
	}
	if c.FusedHalves && !c.FusedExperts {
		e.bad("fused_halves", true, "needs fused_experts")
	}
}
