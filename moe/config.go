// Package moe describes Mixture-of-Experts transformers; package moe/ref
// executes them.
//
// It holds the normalized architecture (Config, which moe/hf reads from a
// Hugging Face config.json), the op vocabulary shared with the flops and
// memory packages (Op, Pass, Recorder), the parameter list with Hugging Face
// tensor names (Params), the checkpointing policies (AC) and what each op
// keeps for backward under them (SavedTensors, the tensors named by Saved).
//
// Shape legend used in identifiers: T tokens, D model (hidden) dim, F expert
// FFN dim, E routed experts, K top-k, H query heads, G KV heads, d head dim,
// V vocabulary, L layers, B sequences of a micro-batch. Letters are the
// dimensions of a row-major buffer, outermost first, and adjacent letters
// may be one flattened dimension: xTKD is [T·K, D], the dispatched rows.
//
// The reference implementation (moe/ref) reports every op it executes to a
// Recorder as (layer, op, pass, count) under the rules of ops.go, and every
// tensor it keeps for backward as a SavedRecord; SavedTensors gives the same
// list analytically (its table, op × policy, is documented in saved.go).
//
// It imports the standard library only: flops, memory and the planner build
// on the description without compiling the reference implementation, its
// kernels or their assembly. Every other package of moescope builds on it.
package moe

import (
	"errors"
	"fmt"
	"math"
)

// ScoreFunc is the router's scoring function.
type ScoreFunc string

// Router score functions.
const (
	// Softmax: p = softmax(x·Wᵀ) over experts, then top-k of p (Qwen, Mixtral, OLMoE, DeepSeek-MoE).
	Softmax ScoreFunc = "softmax"
	// Sigmoid: p = σ(x·Wᵀ); top-k chosen on p + selection bias, weights taken from p (GLM-4.5, DeepSeek-V3).
	Sigmoid ScoreFunc = "sigmoid"
)

// QKNorm says where RMSNorm is applied to queries and keys.
type QKNorm string

// QK-norm variants.
const (
	QKNormNone QKNorm = "none"
	// QKNormHead normalizes each head's d-vector (Qwen3): weights of d elements.
	QKNormHead QKNorm = "head"
	// QKNormFull normalizes the whole projection (OLMoE): q over H·d, k over G·d.
	QKNormFull QKNorm = "full"
)

// Config is the normalized architecture of a decoder-only (MoE) transformer.
// Every size is an element count; a layer is MoE when MoELayer[i] is true and
// dense (an FFN of DenseFFN) otherwise.
type Config struct {
	Name      string `json:"name"`       // built-in name or file path it came from
	ModelType string `json:"model_type"` // the HF model_type it was read from
	Source    string `json:"source"`     // where the numbers come from

	Vocab   int `json:"vocab"`    // V
	Hidden  int `json:"hidden"`   // D
	Layers  int `json:"layers"`   // L
	Heads   int `json:"heads"`    // H, query heads
	KVHeads int `json:"kv_heads"` // G, key/value heads; Heads % KVHeads == 0
	HeadDim int `json:"head_dim"` // d, for q, k and v

	// DenseFFN is the intermediate size of dense (non-MoE) layers.
	DenseFFN int `json:"dense_ffn"`
	// MoELayer[i] says whether layer i is an MoE layer; len == Layers.
	MoELayer []bool `json:"moe_layer"`
	// Window[i] is layer i's sliding attention window in tokens (query i sees
	// keys j with i-Window < j ≤ i, HF's convention); 0 means full causal.
	Window []int `json:"window"`
	// Chunk[i] is layer i's attention chunk (Llama 4's chunked attention,
	// llama4.go); nil or 0 means none.
	Chunk []int `json:"chunk,omitempty"`
	// NoRope[i] skips RoPE on layer i (Llama 4's NoPE layers); nil means
	// RoPE on every layer.
	NoRope []bool `json:"no_rope,omitempty"`
	// Temperature scales NoPE layers' queries by position (llama4.go); nil
	// for none.
	Temperature *AttnTemperature `json:"attn_temperature,omitempty"`

	Experts   int `json:"experts"`    // E, routed experts per MoE layer
	TopK      int `json:"top_k"`      // K, experts per token
	ExpertFFN int `json:"expert_ffn"` // F, intermediate size of each routed expert

	// SharedExperts is the number of always-on experts per MoE layer, each of
	// SharedFFN width; implementations fuse them into one SwiGLU MLP of width
	// SharedExperts·SharedFFN, as DeepSeek and GLM do.
	SharedExperts int `json:"shared_experts"`
	SharedFFN     int `json:"shared_ffn"`
	// SharedGated multiplies the shared experts' output by σ(x·w_g), w_g ∈ R^D (Qwen2-MoE).
	SharedGated bool `json:"shared_gated"`

	Score ScoreFunc `json:"score"`
	// SelectionBias adds a per-expert bias to scores for top-k selection only
	// (no gradient; GLM-4.5's e_score_correction_bias).
	SelectionBias bool `json:"selection_bias"`
	// RoutedScale multiplies the routed experts' combined output (routed_scaling_factor); 1 when absent.
	RoutedScale float64 `json:"routed_scale"`
	// Groups and TopKGroups: grouped top-k (n_group, topk_group). Experts are
	// split into Groups groups; only the TopKGroups best groups are eligible.
	// Groups == 1 disables grouping.
	Groups     int `json:"groups"`
	TopKGroups int `json:"topk_groups"`
	// NormTopK renormalizes the K selected weights to sum to one,
	// w_k ← w_k/(Σ_j w_j + NormTopKEps). DeepSeek-MoE's MoEGate renormalizes
	// only when K > 1, so its loader sets NormTopK = norm_topk_prob && K > 1.
	NormTopK bool `json:"norm_topk"`
	// NormTopKEps is the ε of that sum: 1e-20 where the modeling code adds it
	// (glm4_moe's Glm4MoeMoE.route_tokens_to_experts, DeepSeek-MoE's
	// MoEGate), 0 where it does not (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE).
	NormTopKEps float64 `json:"norm_topk_eps"`
	// RouterBias adds a trained per-expert bias to the router's logits
	// (GPT-OSS's mlp.router.bias); unlike SelectionBias it enters the
	// weights and takes a gradient.
	RouterBias bool `json:"router_bias,omitempty"`
	// ExpertBias adds biases to every routed expert's gate, up and down
	// projections (GPT-OSS's gate_up_proj_bias and down_proj_bias).
	ExpertBias bool `json:"expert_bias,omitempty"`
	// Clamp, when set, replaces the routed experts' silu(gate)·up by
	// GPT-OSS's clamped SwiGLU (swiglu.go); nil for the plain one.
	Clamp *SwiGLUClamp `json:"swiglu_clamp,omitempty"`
	// FusedExperts says the checkpoint stores each MoE layer's routed
	// experts as stacked tensors, gate and up interleaved (fused.go).
	FusedExperts bool `json:"fused_experts,omitempty"`
	// FusedHalves: the fused gate_up_proj holds gate then up (Llama 4),
	// not interleaved (llama4.go).
	FusedHalves bool `json:"fused_halves,omitempty"`
	// RouteInput: the routing weight scales the routed experts' input
	// instead of their output (Llama 4, llama4.go).
	RouteInput bool `json:"route_input,omitempty"`

	QKNorm  QKNorm `json:"qk_norm"`
	QKVBias bool   `json:"qkv_bias"` // biases on q, k and v projections
	// OProjBias adds a bias to o_proj (GPT-OSS's attention_bias covers q,
	// k, v and o).
	OProjBias bool `json:"o_proj_bias,omitempty"`
	// AttnSinks gives every query head one learned logit that joins each
	// softmax row of attention and takes probability mass without a value
	// row (GPT-OSS's self_attn.sinks, sinks.go).
	AttnSinks      bool    `json:"attn_sinks,omitempty"`
	RotaryFraction float64 `json:"rotary_fraction"` // fraction of d rotated by RoPE (partial_rotary_factor)
	RopeTheta      float64 `json:"rope_theta"`
	// RopeScaling is the rope_type of HF's rope_scaling (or
	// rope_parameters) when it is not "default" (llama3, yarn, linear, …):
	// it changes RoPE's frequencies, which the accounting does not see. The
	// reference implementation executes "yarn" (with Yarn) and refuses the
	// others (moe/ref's NewModel).
	RopeScaling string `json:"rope_scaling,omitempty"`
	// Yarn holds YaRN's parameters when RopeScaling is "yarn" (yarn.go;
	// package moe/ref/rope applies them); nil otherwise.
	Yarn *Yarn `json:"yarn,omitempty"`
	// RopeInterleave rotates adjacent pairs (x₀,x₁), (x₂,x₃), … instead of
	// the halves (x_i, x_{i+r/2}) (DeepSeek-V3's rope_interleave; DeepSeek-V2's
	// complex-number RoPE is the same rotation).
	RopeInterleave bool `json:"rope_interleave,omitempty"`
	// AttnScale is the softmax scale of q·kᵀ; 0 means 1/√HeadDim. YaRN
	// configs of DeepSeek-V3 set (1/√HeadDim)·mscale² (see moe/hf).
	AttnScale      float64 `json:"attn_scale,omitempty"`
	TiedEmbeddings bool    `json:"tied_embeddings"`
	NormEps        float64 `json:"norm_eps"`

	// AuxLossCoef is router_aux_loss_coef; HF adds coef·aux to the loss only
	// when OutputRouterLogits is true.
	AuxLossCoef        float64 `json:"aux_loss_coef"`
	OutputRouterLogits bool    `json:"output_router_logits"`
	// SeqAuxLoss selects DeepSeek-MoE's aux loss (MoEGate with seq_aux):
	// one loss per MoE layer and per sequence, summed over the layers,
	// instead of HF's load_balancing_loss_func over every layer's tokens at
	// once (both in moe/ref's aux.go).
	SeqAuxLoss bool    `json:"seq_aux_loss"`
	InitRange  float64 `json:"init_range"` // std of the normal initialization

	// MLA is multi-head latent attention (mla.go); zero for standard attention.
	MLA MLA `json:"mla"`
	// MTPLayers is num_nextn_predict_layers: multi-token-prediction modules
	// in the checkpoint beyond Layers. Hugging Face's model ignores them and
	// so does every count here unless a caller asks (flops.MTPParams,
	// flops.MegatronMTPPerStep, moescope flops --mtp).
	MTPLayers int `json:"mtp_layers,omitempty"`

	// Names are the checkpoint's module names where they differ between
	// model types.
	Names TensorNames `json:"names"`
	// IgnoreExtraLayers skips, when loading a checkpoint, the tensors of
	// layers numbered ≥ Layers (GLM-4.5's multi-token-prediction block), as
	// transformers does for that model type; otherwise they are an error.
	IgnoreExtraLayers bool `json:"ignore_extra_layers"`
}

// TensorNames are the Hugging Face module names that differ between model
// types. An empty field means the name in its comment (Qwen3-MoE's, which
// DeepSeek-MoE, OLMoE and GLM-4.5 share).
type TensorNames struct {
	MoE        string `json:"moe,omitempty"`         // module of the router and routed experts: "mlp"
	Router     string `json:"router,omitempty"`      // router module inside it: "gate"
	ExpertGate string `json:"expert_gate,omitempty"` // routed expert's gate projection: "gate_proj"
	ExpertUp   string `json:"expert_up,omitempty"`   // routed expert's up projection: "up_proj"
	ExpertDown string `json:"expert_down,omitempty"` // routed expert's down projection: "down_proj"
	Shared     string `json:"shared,omitempty"`      // shared-experts module: "shared_experts"
	Dense      string `json:"dense,omitempty"`       // dense layers' FFN module: "mlp"
}

// MoELayers counts the MoE layers.
func (c *Config) MoELayers() int {
	n := 0
	for _, m := range c.MoELayer {
		if m {
			n++
		}
	}
	return n
}

// RotaryDim is the number of head dimensions RoPE rotates (even).
func (c *Config) RotaryDim() int {
	if c.IsMLA() {
		return c.MLA.Rope
	}
	r := int(math.Round(float64(c.HeadDim) * c.RotaryFraction))
	return r - r%2
}

// IsMoE reports whether the model has any routed experts.
func (c *Config) IsMoE() bool { return c.Experts > 0 && c.MoELayers() > 0 }

// FieldError is one violated constraint of a Config or of a run
// description (moe/job).
type FieldError struct {
	Field   string // JSON field name
	Value   any    // offending value
	Allowed string // what would be accepted
}

func (e FieldError) Error() string {
	return fmt.Sprintf("%s = %v: %s", e.Field, e.Value, e.Allowed)
}

// MaxDim bounds every size so that products used in accounting stay far from
// int64 overflow before the checked arithmetic of the flops package even runs.
const MaxDim = 1 << 24

// maxTensors bounds the number of parameter tensors, which Params and every
// consumer of it (memory, grad, the parallel schedules) enumerate one by one.
// Published models have tens of thousands: DeepSeek-V3 61 layers with 256
// experts of 3 matrices each, about 47,000; Qwen3-235B-A22B about 36,000.
const maxTensors = 1 << 20

// maxTensorsPerLayer is the most non-expert tensors a layer has in Params:
// two norms, q/k/v/o with four biases, the sinks, two QK-norms, router with
// its bias and selection bias, three FFN or shared-expert matrices and the
// shared-expert gate.
const maxTensorsPerLayer = 20

// Validate returns every violated constraint at once, joined with
// errors.Join; each is a FieldError naming the field, the value and what is
// allowed. A nil result means the config can be accounted and executed.
func (c *Config) Validate() error {
	var e fieldErrors
	c.validateShape(&e)
	c.validateMoE(&e)
	c.validateTensorCount(&e)
	c.validateShared(&e)
	c.validateNumerics(&e)
	c.validateMLA(&e)
	c.validateSinks(&e)
	c.validateSwiGLU(&e)
	c.validateFused(&e)
	c.validateLlama4(&e)
	return errors.Join(e...)
}

// fieldErrors collects Validate's FieldErrors in the order found.
type fieldErrors []error

func (e *fieldErrors) bad(field string, v any, allowed string) {
	*e = append(*e, FieldError{field, v, allowed})
}

// pos requires a size in [1, MaxDim].
func (e *fieldErrors) pos(field string, v int) {
	if v <= 0 || v > MaxDim {
		e.bad(field, v, fmt.Sprintf("must be in [1, %d]", MaxDim))
	}
}

// validateShape checks the sizes every model has and the per-layer lists.
func (c *Config) validateShape(e *fieldErrors) {
	e.pos("vocab", c.Vocab)
	e.pos("hidden", c.Hidden)
	e.pos("layers", c.Layers)
	e.pos("heads", c.Heads)
	e.pos("kv_heads", c.KVHeads)
	e.pos("head_dim", c.HeadDim)
	if c.Heads > 0 && c.KVHeads > 0 && c.Heads%c.KVHeads != 0 {
		e.bad("kv_heads", c.KVHeads, fmt.Sprintf("must divide heads = %d", c.Heads))
	}
	if c.Layers > 0 && c.Layers <= MaxDim {
		if len(c.MoELayer) != c.Layers {
			e.bad("moe_layer", len(c.MoELayer), fmt.Sprintf("needs one entry per layer (%d)", c.Layers))
		}
		if len(c.Window) != c.Layers {
			e.bad("window", len(c.Window), fmt.Sprintf("needs one entry per layer (%d)", c.Layers))
		}
	}
	for i, w := range c.Window {
		if w < 0 || w > MaxDim {
			e.bad(fmt.Sprintf("window[%d]", i), w, fmt.Sprintf("must be 0 (full) or in [1, %d]", MaxDim))
		}
	}
}

// validateMoE checks the FFN widths and the routing of the MoE layers.
func (c *Config) validateMoE(e *fieldErrors) {
	moeLayers := c.MoELayers()
	if moeLayers < len(c.MoELayer) {
		e.pos("dense_ffn", c.DenseFFN)
	} else if c.DenseFFN < 0 || c.DenseFFN > MaxDim {
		e.bad("dense_ffn", c.DenseFFN, fmt.Sprintf("must be in [0, %d]", MaxDim))
	}
	if moeLayers > 0 {
		e.pos("experts", c.Experts)
		e.pos("expert_ffn", c.ExpertFFN)
		if c.TopK <= 0 || (c.Experts > 0 && c.TopK > c.Experts) {
			e.bad("top_k", c.TopK, fmt.Sprintf("must be in [1, experts = %d]", c.Experts))
		}
		switch c.Score {
		case Softmax, Sigmoid:
		default:
			e.bad("score", c.Score, `must be "softmax" or "sigmoid"`)
		}
		if c.SelectionBias && c.Score != Sigmoid {
			e.bad("selection_bias", c.SelectionBias, `only with score = "sigmoid"`)
		}
		if c.Groups <= 0 || (c.Experts > 0 && c.Experts%c.Groups != 0) {
			e.bad("groups", c.Groups, fmt.Sprintf("must be ≥ 1 and divide experts = %d", c.Experts))
		} else if c.TopKGroups <= 0 || c.TopKGroups > c.Groups {
			e.bad("topk_groups", c.TopKGroups, fmt.Sprintf("must be in [1, groups = %d]", c.Groups))
		} else if c.Groups > 1 && c.TopK > c.TopKGroups*(c.Experts/c.Groups) {
			e.bad("top_k", c.TopK, fmt.Sprintf("must be ≤ topk_groups·experts/groups = %d", c.TopKGroups*(c.Experts/c.Groups)))
		}
		if !(c.RoutedScale > 0) || math.IsInf(c.RoutedScale, 0) {
			e.bad("routed_scale", c.RoutedScale, "must be a finite number > 0")
		}
	}
}

// validateTensorCount bounds the parameter tensors, so that a config cannot
// ask for more than a checkpoint index or the accounting can hold.
func (c *Config) validateTensorCount(e *fieldErrors) {
	moeLayers := c.MoELayers()
	if c.Layers > 0 && c.Layers <= MaxDim && c.Experts >= 0 && c.Experts <= MaxDim {
		// Embedding, final norm and LM head, each layer's own tensors, and
		// each routed expert's tensors in each MoE layer (an upper bound).
		n := 3 + maxTensorsPerLayer*int64(c.Layers) + int64(c.tensorsPerExpert())*int64(c.Experts)*int64(moeLayers)
		if n > maxTensors {
			e.bad("layers, experts", fmt.Sprintf("%d, %d (%d MoE layers)", c.Layers, c.Experts, moeLayers),
				fmt.Sprintf("up to %d parameter tensors; at most %d are supported (%d per routed expert per MoE layer, ≤ %d more per layer)",
					n, maxTensors, c.tensorsPerExpert(), maxTensorsPerLayer))
		}
	}
}

// validateShared checks the shared experts.
func (c *Config) validateShared(e *fieldErrors) {
	if c.SharedExperts < 0 || c.SharedExperts > MaxDim {
		e.bad("shared_experts", c.SharedExperts, fmt.Sprintf("must be in [0, %d]", MaxDim))
	}
	if c.SharedExperts > 0 {
		e.pos("shared_ffn", c.SharedFFN)
	}
	if c.SharedGated && c.SharedExperts == 0 {
		e.bad("shared_gated", c.SharedGated, "needs shared_experts ≥ 1")
	}
}

// validateYarn checks YaRN's parameters: present exactly when RopeScaling
// is "yarn", each finite and positive (a β of 0 would put the correction
// range at infinity), the original context length a size. RoPE's base must
// differ from 1: the correction range divides by ln θ.
func (c *Config) validateYarn(e *fieldErrors) {
	y := c.Yarn
	switch {
	case c.RopeScaling == "yarn" && y == nil:
		e.bad("yarn", nil, `required when rope_scaling is "yarn"`)
		return
	case y == nil:
		return
	case c.RopeScaling != "yarn":
		e.bad("yarn", "set", fmt.Sprintf(`only with rope_scaling "yarn" (rope_scaling = %q)`, c.RopeScaling))
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"yarn.factor", y.Factor}, {"yarn.beta_fast", y.BetaFast}, {"yarn.beta_slow", y.BetaSlow}, {"yarn.attention_factor", y.AttentionFactor}} {
		if !(f.v > 0) || math.IsInf(f.v, 0) {
			e.bad(f.name, f.v, "must be a finite number > 0")
		}
	}
	e.pos("yarn.original_max_position_embeddings", y.OriginalMaxPositions)
	if c.RopeTheta == 1 {
		e.bad("rope_theta", c.RopeTheta, "must differ from 1 with YaRN (its correction range divides by ln rope_theta)")
	}
}

// validateNumerics checks the attention, RoPE, normalization, loss and
// initialization constants.
func (c *Config) validateNumerics(e *fieldErrors) {
	switch c.QKNorm {
	case QKNormNone, QKNormHead, QKNormFull, QKNormL2Rope:
	default:
		e.bad("qk_norm", c.QKNorm, `must be "none", "head", "full" or "l2_rope"`)
	}
	if !(c.RotaryFraction > 0 && c.RotaryFraction <= 1) {
		e.bad("rotary_fraction", c.RotaryFraction, "must be in (0, 1]")
	} else if c.HeadDim > 0 && c.RotaryDim() == 0 {
		e.bad("rotary_fraction", c.RotaryFraction, fmt.Sprintf("rotates no dimension of head_dim = %d", c.HeadDim))
	}
	if !(c.RopeTheta > 0) || math.IsInf(c.RopeTheta, 0) {
		e.bad("rope_theta", c.RopeTheta, "must be a finite number > 0")
	}
	c.validateYarn(e)
	if !(c.NormEps > 0 && c.NormEps < 1) {
		e.bad("norm_eps", c.NormEps, "must be in (0, 1)")
	}
	if !(c.NormTopKEps >= 0) || math.IsInf(c.NormTopKEps, 0) {
		e.bad("norm_topk_eps", c.NormTopKEps, "must be a finite number ≥ 0")
	}
	if !(c.AuxLossCoef >= 0) || math.IsInf(c.AuxLossCoef, 0) {
		e.bad("aux_loss_coef", c.AuxLossCoef, "must be a finite number ≥ 0")
	}
	if !(c.AttnScale >= 0) || math.IsInf(c.AttnScale, 0) {
		e.bad("attn_scale", c.AttnScale, "must be 0 (1/√head_dim) or a finite number > 0")
	}
	if c.MTPLayers < 0 || c.MTPLayers > MaxDim {
		e.bad("mtp_layers", c.MTPLayers, fmt.Sprintf("must be in [0, %d]", MaxDim))
	}
	if !(c.InitRange > 0) || math.IsInf(c.InitRange, 0) {
		e.bad("init_range", c.InitRange, "must be a finite number > 0")
	}
}
