package moe

import "strconv"

// ParamGroup classifies a parameter for counting and reporting.
type ParamGroup string

// Parameter groups.
const (
	GroupEmbedding ParamGroup = "embedding"
	GroupAttention ParamGroup = "attention" // q, k, v, o projections and their biases
	GroupNorm      ParamGroup = "norm"      // every RMSNorm weight, QK-norm included
	GroupRouter    ParamGroup = "router"    // router weight (and the selection-bias buffer)
	GroupRouted    ParamGroup = "routed_experts"
	GroupShared    ParamGroup = "shared_experts" // shared experts and their sigmoid gate
	GroupDenseFFN  ParamGroup = "dense_ffn"
	GroupLMHead    ParamGroup = "lm_head"
)

// Groups returns the parameter groups in report order (a new slice each
// call, so no caller can reorder another's).
func Groups() []ParamGroup {
	return []ParamGroup{GroupEmbedding, GroupAttention, GroupNorm, GroupRouter, GroupRouted, GroupShared, GroupDenseFFN, GroupLMHead}
}

// Param is one tensor of the model as Hugging Face names and shapes it
// (row-major, PyTorch's [out, in] for linear weights).
type Param struct {
	Name   string
	Shape  []int
	Group  ParamGroup
	Layer  int  // decoder layer, or -1 for embedding, final norm and LM head
	Expert int  // routed expert index, or -1
	Buffer bool // in the checkpoint but not trained (selection bias): excluded from parameter counts
}

// Elements is the product of the shape.
func (p Param) Elements() int64 {
	n := int64(1)
	for _, s := range p.Shape {
		n *= int64(s)
	}
	return n
}

// withDefaults fills the empty names with Qwen3-MoE's.
func (n TensorNames) withDefaults() TensorNames {
	for _, f := range []struct {
		name *string
		def  string
	}{{&n.MoE, "mlp"}, {&n.ExpertGate, "gate_proj"}, {&n.ExpertUp, "up_proj"}, {&n.ExpertDown, "down_proj"},
		{&n.Shared, "shared_experts"}} {
		if *f.name == "" {
			*f.name = f.def
		}
	}
	return n
}

// Params lists every tensor of the model under its Hugging Face name, in a
// fixed order: embedding, then each layer, then final norm and LM head (absent
// when embeddings are tied). The config must be valid.
func (c *Config) Params() []Param {
	n := c.Names.withDefaults()
	D, V := c.Hidden, c.Vocab
	// One allocation for the entries and one for their shapes: models with
	// many experts have tens of thousands of tensors, and callers such as the
	// planner list them for every candidate.
	count := 3 + 16*c.Layers + 3*c.Experts*c.MoELayers()
	ps := make([]Param, 0, count)
	dims := make([]int, 0, 2*count)
	add := func(name string, g ParamGroup, layer, expert int, shape ...int) {
		start := len(dims)
		dims = append(dims, shape...)
		ps = append(ps, Param{Name: name, Shape: dims[start:len(dims):len(dims)], Group: g, Layer: layer, Expert: expert})
	}
	add("model.embed_tokens.weight", GroupEmbedding, -1, -1, V, D)
	for l := 0; l < c.Layers; l++ {
		p := "model.layers." + strconv.Itoa(l) + "."
		add(p+"input_layernorm.weight", GroupNorm, l, -1, D)
		a := p + "self_attn."
		if c.IsMLA() {
			c.mlaParams(a, l, add)
		} else {
			c.attnParams(a, l, add)
		}
		add(p+"post_attention_layernorm.weight", GroupNorm, l, -1, D)
		if !c.MoELayer[l] {
			m := p + "mlp."
			add(m+"gate_proj.weight", GroupDenseFFN, l, -1, c.DenseFFN, D)
			add(m+"up_proj.weight", GroupDenseFFN, l, -1, c.DenseFFN, D)
			add(m+"down_proj.weight", GroupDenseFFN, l, -1, D, c.DenseFFN)
			continue
		}
		m := p + n.MoE + "."
		add(m+"gate.weight", GroupRouter, l, -1, c.Experts, D)
		if c.SelectionBias {
			ps = append(ps, Param{Name: m + "gate.e_score_correction_bias", Shape: []int{c.Experts}, Group: GroupRouter, Layer: l, Expert: -1, Buffer: true})
		}
		for e := 0; e < c.Experts; e++ {
			x := m + "experts." + strconv.Itoa(e) + "."
			add(x+n.ExpertGate+".weight", GroupRouted, l, e, c.ExpertFFN, D)
			add(x+n.ExpertUp+".weight", GroupRouted, l, e, c.ExpertFFN, D)
			add(x+n.ExpertDown+".weight", GroupRouted, l, e, D, c.ExpertFFN)
		}
		if c.SharedExperts > 0 {
			s := m + n.Shared + "."
			w := c.SharedExperts * c.SharedFFN
			add(s+"gate_proj.weight", GroupShared, l, -1, w, D)
			add(s+"up_proj.weight", GroupShared, l, -1, w, D)
			add(s+"down_proj.weight", GroupShared, l, -1, D, w)
			if c.SharedGated {
				add(m+"shared_expert_gate.weight", GroupShared, l, -1, 1, D)
			}
		}
	}
	add("model.norm.weight", GroupNorm, -1, -1, D)
	if !c.TiedEmbeddings {
		add("lm_head.weight", GroupLMHead, -1, -1, V, D)
	}
	return ps
}

// paramAdder appends one tensor to the list Params builds.
type paramAdder func(name string, g ParamGroup, layer, expert int, shape ...int)

// mlaParams adds the attention tensors of an MLA layer under prefix a
// ("model.layers.l.self_attn."), named and shaped as DeepseekV3Attention
// declares them; the latent norms are in GroupNorm.
func (c *Config) mlaParams(a string, l int, add paramAdder) {
	m, D, H := c.MLA, c.Hidden, c.Heads
	qk := H * (m.Nope + m.Rope)
	if m.QRank == 0 {
		add(a+"q_proj.weight", GroupAttention, l, -1, qk, D)
	} else {
		add(a+"q_a_proj.weight", GroupAttention, l, -1, m.QRank, D)
		add(a+"q_a_layernorm.weight", GroupNorm, l, -1, m.QRank)
		add(a+"q_b_proj.weight", GroupAttention, l, -1, qk, m.QRank)
	}
	add(a+"kv_a_proj_with_mqa.weight", GroupAttention, l, -1, m.KVRank+m.Rope, D)
	add(a+"kv_a_layernorm.weight", GroupNorm, l, -1, m.KVRank)
	add(a+"kv_b_proj.weight", GroupAttention, l, -1, H*(m.Nope+m.V), m.KVRank)
	add(a+"o_proj.weight", GroupAttention, l, -1, D, H*m.V)
}

// attnParams adds the q, k, v, o projections (and biases and QK-norms) of a
// standard attention layer under prefix a.
func (c *Config) attnParams(a string, l int, add paramAdder) {
	D, H, G, d := c.Hidden, c.Heads, c.KVHeads, c.HeadDim
	add(a+"q_proj.weight", GroupAttention, l, -1, H*d, D)
	if c.QKVBias {
		add(a+"q_proj.bias", GroupAttention, l, -1, H*d)
	}
	add(a+"k_proj.weight", GroupAttention, l, -1, G*d, D)
	if c.QKVBias {
		add(a+"k_proj.bias", GroupAttention, l, -1, G*d)
	}
	add(a+"v_proj.weight", GroupAttention, l, -1, G*d, D)
	if c.QKVBias {
		add(a+"v_proj.bias", GroupAttention, l, -1, G*d)
	}
	add(a+"o_proj.weight", GroupAttention, l, -1, D, H*d)
	switch c.QKNorm {
	case QKNormHead:
		add(a+"q_norm.weight", GroupNorm, l, -1, d)
		add(a+"k_norm.weight", GroupNorm, l, -1, d)
	case QKNormFull:
		add(a+"q_norm.weight", GroupNorm, l, -1, H*d)
		add(a+"k_norm.weight", GroupNorm, l, -1, G*d)
	}
}
