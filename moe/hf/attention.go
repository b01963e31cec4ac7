package hf

import (
	"fmt"

	"github.com/moescope/moescope/moe"
)

// Attention's keys for the model types without latent attention
// (deepseek.go reads MLA's): KV heads, head dim, biases and QK-norm; and
// every type's sliding windows.

// attention fills KV heads, head dim, projection biases and QK-norm.
func (h *configJSON) attention(c *moe.Config, def hfDefault, e *hfErrors) {
	c.KVHeads = opt(h.NumKeyValueHeads, c.Heads)
	switch {
	case h.HeadDim != nil:
		c.HeadDim = *h.HeadDim
	case c.Heads > 0:
		c.HeadDim = c.Hidden / c.Heads
	}
	c.QKNorm, c.QKVBias = def.qkNorm, def.qkvBias
	if h.ClipQKV != nil {
		e.unsupported("clip_qkv", *h.ClipQKV, "QKV clipping is not modelled")
	}
	if bias := opt(h.AttentionBias, false); bias {
		switch {
		case def.oProjHasBias:
			e.unsupported("attention_bias", true, h.ModelType+" then also puts a bias on o_proj, which is not modelled")
		case h.ModelType == "glm4_moe":
			c.QKVBias = true // q, k, v biases; o_proj has none
		}
		// mixtral and qwen2_moe do not read attention_bias.
	}
	if h.ModelType == "qwen2_moe" && h.QKVBias != nil {
		c.QKVBias = *h.QKVBias
	}
	if h.ModelType == "glm4_moe" && opt(h.UseQKNorm, false) {
		c.QKNorm = moe.QKNormHead
	}
}

// windows fills the per-layer attention window: layer_types when given
// (transformers ≥ 4.53), else Qwen's use_sliding_window with layers from
// max_window_layers on sliding, else Mixtral's sliding_window on every layer.
func (h *configJSON) windows(c *moe.Config) error {
	w := 0
	if h.SlidingWindow != nil {
		w = *h.SlidingWindow
		if w <= 0 {
			return fmt.Errorf("sliding_window = %d: must be ≥ 1 or null", w)
		}
	}
	if h.ModelType == "gpt_oss" {
		return h.gptOSSWindows(c)
	}
	if hfDefaults[h.ModelType].llama4 {
		return h.llama4Layers(c)
	}
	if h.LayerTypes != nil {
		return h.layerTypes(c, w)
	}
	switch h.ModelType {
	case "mixtral":
		for i := range c.Window {
			c.Window[i] = w
		}
	case "qwen3_moe", "qwen2_moe", "qwen3":
		// The Qwen config classes default sliding_window to 4096 (an
		// explicit null disables it) and max_window_layers to 28.
		if !h.slidingWindowSet {
			w = 4096
		}
		if w == 0 || h.UseSlidingWindow == nil || !*h.UseSlidingWindow {
			return nil
		}
		first := 28
		if h.MaxWindowLayers != nil {
			first = *h.MaxWindowLayers
		}
		for i := range c.Window {
			if i >= first {
				c.Window[i] = w
			}
		}
	}
	return nil
}

// layerTypes sets the window of every layer layer_types calls
// "sliding_attention" to w (0: sliding_window is null).
func (h *configJSON) layerTypes(c *moe.Config, w int) error {
	if len(h.LayerTypes) != c.Layers {
		return fmt.Errorf("layer_types has %d entries: needs one per layer (%d)", len(h.LayerTypes), c.Layers)
	}
	for i, t := range h.LayerTypes {
		switch t {
		case "full_attention":
		case "sliding_attention":
			if w == 0 {
				return fmt.Errorf("layer_types[%d] = %q but sliding_window is null", i, t)
			}
			c.Window[i] = w
		default:
			return fmt.Errorf("layer_types[%d] = %q: not supported (full_attention or sliding_attention)", i, t)
		}
	}
	return nil
}
