package hf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/moescope/moescope/moe"
)

// Llama 4 configs: model_type llama4 (Llama4Config, whose text_config is
// read and whose vision_config is ignored: moescope models the text
// decoder) and the flat llama4_text (Llama4TextConfig), read with the
// defaults of configuration_llama4.py at transformers 008e5743 and run as
// modeling_llama4.py at transformers 000c33fd computes:
//
//   - MoE layers: moe_layers, else range(step-1, L, step) of
//     interleave_moe_layer_step (default 1); the other layers are dense
//     Llama4TextMLP of intermediate_size_mlp (default 16384).
//   - Llama4TextMoe: a bias-free router whose top-k logits pass a sigmoid
//     (no renormalization) and scale the routed input rows; one shared
//     expert Llama4TextMLP of intermediate_size beside the routed ones;
//     stacked experts gate_up_proj [E, D, 2F] split into halves.
//   - no_rope_layers[i] == 1: RoPE (complex, adjacent pairs) and, through
//     layer_types' default, chunked attention of attention_chunk_size
//     (default 8192); 0: a NoPE layer with full causal attention. Absent
//     or empty, the list is [(i+1) % no_rope_layer_interval != 0] (interval 4).
//   - use_qk_norm (default true): weightless L2 norm of q and k per head on
//     RoPE layers; attn_temperature_tuning (default true; released configs
//     write 4, which Python reads as true) with floor_scale 8192 and
//     attn_scale 0.1 on NoPE layers.
//   - Llama4ForCausalLM adds no router loss, so the aux-loss keys are
//     ignored; head_dim defaults to 128 and num_key_value_heads to 8.

// llama4Default is Llama4TextConfig's defaults for the optional keys.
var llama4Default = hfDefault{normEps: 1e-5, ropeTheta: 500000, rotary: 1, qkNorm: moe.QKNormNone, moe: true, llama4: true}

// llama4TextConfig replaces a llama4 config by its text_config, keeping
// the outer model_type and _source.
func (h *configJSON) llama4TextConfig() (*configJSON, error) {
	if len(h.TextConfig) == 0 || bytes.Equal(bytes.TrimSpace(h.TextConfig), []byte("null")) {
		return nil, fmt.Errorf("text_config: required key is missing (model_type llama4 keeps the text model's keys there)")
	}
	t, err := decodeHF(h.TextConfig)
	if err != nil {
		return nil, fmt.Errorf("text_config: %w", err)
	}
	if len(t.TextConfig) > 0 {
		return nil, fmt.Errorf("text_config: holds another text_config")
	}
	t.ModelType, t.Source = "llama4", h.Source
	return t, nil
}

// llama4Attention fills attention: attention_bias puts biases on q, k, v
// and o; RoPE rotates adjacent pairs (apply_rotary_emb's view_as_complex).
func (h *configJSON) llama4Attention(c *moe.Config, def hfDefault, e *hfErrors) {
	h.attention(c, def, e)
	c.KVHeads = opt(h.NumKeyValueHeads, 8)
	c.HeadDim = opt(h.HeadDim, 128)
	bias := opt(h.AttentionBias, false)
	c.QKVBias, c.OProjBias = bias, bias
	c.RopeInterleave = true
	if opt(h.UseQKNorm, true) {
		c.QKNorm = moe.QKNormL2Rope
	}
}

// moeLlama4 fills Llama 4's experts, routing and dense width; the result
// says which layers are MoE.
func (h *configJSON) moeLlama4(c *moe.Config, layersOK bool, e *hfErrors) func(int) bool {
	c.Experts = e.req("num_local_experts", h.NumLocalExperts)
	c.ExpertFFN = e.req("intermediate_size", h.IntermediateSize)
	c.SharedExperts, c.SharedFFN = 1, c.ExpertFFN
	c.Score, c.RouteInput, c.NormTopK = moe.Sigmoid, true, false
	c.FusedExperts, c.FusedHalves = true, true
	c.AuxLossCoef, c.OutputRouterLogits = 0, false
	c.Names = moe.TensorNames{MoE: "feed_forward", Router: "router", Shared: "shared_expert", Dense: "feed_forward"}
	isMoE := map[int]bool{}
	if h.MoELayers != nil {
		for _, i := range h.MoELayers {
			if layersOK && i >= c.Layers {
				e.unsupported("moe_layers", i, fmt.Sprintf("layer index must be in [0, %d)", c.Layers))
			}
			isMoE[i] = true
		}
	} else {
		step := opt(h.InterleaveMoEStep, 1)
		if step <= 0 {
			e.unsupported("interleave_moe_layer_step", step, "must be ≥ 1")
			step = 1
		}
		for i := step - 1; layersOK && i < c.Layers; i += step {
			isMoE[i] = true
		}
	}
	if layersOK && len(isMoE) < c.Layers {
		c.DenseFFN = opt(h.IntermediateSizeMLP, 16384)
	}
	return func(i int) bool { return isMoE[i] }
}

// llama4Layers fills, per layer, RoPE or NoPE, the attention chunk and the
// NoPE layers' temperature tuning.
func (h *configJSON) llama4Layers(c *moe.Config) error {
	rope, err := h.llama4NoRope(c.Layers)
	if err != nil {
		return err
	}
	types := h.LayerTypes
	if types == nil {
		for _, r := range rope {
			types = append(types, map[bool]string{true: "chunked_attention", false: "full_attention"}[r])
		}
	}
	if len(types) != c.Layers {
		return fmt.Errorf("layer_types has %d entries: needs one per layer (%d)", len(types), c.Layers)
	}
	c.Chunk, c.NoRope = make([]int, c.Layers), make([]bool, c.Layers)
	for i, t := range types {
		c.NoRope[i] = !rope[i]
		switch t {
		case "full_attention":
		case "chunked_attention":
			if h.AttentionChunkSize != nil && *h.AttentionChunkSize <= 0 {
				return fmt.Errorf("attention_chunk_size = %d: must be ≥ 1", *h.AttentionChunkSize)
			}
			if h.AttentionChunkSize == nil && h.attnChunkSet {
				return fmt.Errorf("layer_types[%d] = %q but attention_chunk_size is null", i, t)
			}
			c.Chunk[i] = opt(h.AttentionChunkSize, 8192)
		default:
			return fmt.Errorf("layer_types[%d] = %q: not supported (full_attention or chunked_attention)", i, t)
		}
	}
	return h.llama4Temperature(c)
}

// llama4NoRope returns, per layer, whether it applies RoPE.
func (h *configJSON) llama4NoRope(layers int) ([]bool, error) {
	rope := make([]bool, layers)
	if len(h.NoRopeLayers) > 0 {
		if len(h.NoRopeLayers) < layers {
			return nil, fmt.Errorf("no_rope_layers has %d entries: needs at least one per layer (%d)", len(h.NoRopeLayers), layers)
		}
		for i := range rope {
			switch v := h.NoRopeLayers[i]; v {
			case 0, 1:
				rope[i] = v == 1
			default:
				return nil, fmt.Errorf("no_rope_layers[%d] = %d: must be 1 (RoPE) or 0 (NoPE)", i, v)
			}
		}
		return rope, nil
	}
	n := opt(h.NoRopeLayerInterval, 4)
	if n <= 0 {
		return nil, fmt.Errorf("no_rope_layer_interval = %d: must be ≥ 1", n)
	}
	for i := range rope {
		rope[i] = (i+1)%n != 0
	}
	return rope, nil
}

// llama4Temperature sets the temperature tuning when it is on and some
// layer is NoPE (it touches no other layer).
func (h *configJSON) llama4Temperature(c *moe.Config) error {
	on, err := pythonTruth("attn_temperature_tuning", h.AttnTemperatureTune, true)
	if err != nil || !on || c.RopedLayers() == c.Layers {
		return err
	}
	fs := opt(h.FloorScale, 8192)
	if fs != float64(int(fs)) || fs < 1 || fs > moe.MaxDim {
		return fmt.Errorf("floor_scale = %v: must be an integer in [1, %d]", fs, moe.MaxDim)
	}
	c.Temperature = &moe.AttnTemperature{FloorScale: int(fs), Scale: opt(h.AttnScale, 0.1)}
	return nil
}

// pythonTruth reads a key that Python tests for truth: absent is def; null,
// false and 0 are false; true and other numbers are true.
func pythonTruth(key string, raw json.RawMessage, def bool) (bool, error) {
	s := string(bytes.TrimSpace(raw))
	switch s {
	case "":
		return def, nil
	case "null", "false":
		return false, nil
	case "true":
		return true, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return false, fmt.Errorf("%s = %s: must be true, false or a number", key, s)
	}
	return f != 0, nil
}
