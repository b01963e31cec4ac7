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
	// TP is the dimension tensor parallelism cuts the tensor along.
	TP TPSplit
}

// TPSplit is how torchtitan's tensor-parallel plan (v0.2.2
// models/qwen3/infra/parallelize.py apply_non_moe_tp and
// models/llama4/infra/parallelize.py apply_moe_ep_tp) places a tensor on
// the tp ranks.
type TPSplit uint8

// Tensor-parallel placements.
const (
	// TPReplicated: whole on every tp rank (norms, QK-norms, the router
	// gate under NoParallel, Qwen2-MoE's shared-expert gate, MLA tensors,
	// which tp refuses).
	TPReplicated TPSplit = iota
	// TPDim0: cut along dim 0: column-wise linears (q, k, v, gate and up
	// projections, the LM head) with their biases, and the embedding's
	// vocabulary rows (RowwiseParallel on an nn.Embedding shards dim 0).
	TPDim0
	// TPDim1: cut along dim 1: row-wise linears (o and down projections).
	TPDim1
)

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
	}{{&n.MoE, "mlp"}, {&n.Router, "gate"}, {&n.ExpertGate, "gate_proj"}, {&n.ExpertUp, "up_proj"}, {&n.ExpertDown, "down_proj"},
		{&n.Shared, "shared_experts"}, {&n.Dense, "mlp"}} {
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
	count := 3 + maxTensorsPerLayer*c.Layers + c.tensorsPerExpert()*c.Experts*c.MoELayers()
	ps := make([]Param, 0, count)
	dims := make([]int, 0, 2*count)
	add := func(name string, g ParamGroup, layer, expert int, shape ...int) {
		start := len(dims)
		dims = append(dims, shape...)
		ps = append(ps, Param{Name: name, Shape: dims[start:len(dims):len(dims)], Group: g, Layer: layer, Expert: expert})
	}
	// split places the tensor added last (see TPSplit).
	split := func(s TPSplit) { ps[len(ps)-1].TP = s }
	add("model.embed_tokens.weight", GroupEmbedding, -1, -1, V, D)
	split(TPDim0)
	for l := 0; l < c.Layers; l++ {
		p := "model.layers." + strconv.Itoa(l) + "."
		add(p+"input_layernorm.weight", GroupNorm, l, -1, D)
		a := p + "self_attn."
		if c.IsMLA() {
			c.mlaParams(a, l, add)
		} else {
			c.attnParams(a, l, add, split)
		}
		add(p+"post_attention_layernorm.weight", GroupNorm, l, -1, D)
		if !c.MoELayer[l] {
			m := p + n.Dense + "."
			add(m+"gate_proj.weight", GroupDenseFFN, l, -1, c.DenseFFN, D)
			split(TPDim0)
			add(m+"up_proj.weight", GroupDenseFFN, l, -1, c.DenseFFN, D)
			split(TPDim0)
			add(m+"down_proj.weight", GroupDenseFFN, l, -1, D, c.DenseFFN)
			split(TPDim1)
			continue
		}
		m := p + n.MoE + "."
		r := m + n.Router + "."
		add(r+"weight", GroupRouter, l, -1, c.Experts, D)
		if c.RouterBias {
			add(r+"bias", GroupRouter, l, -1, c.Experts)
		}
		if c.SelectionBias {
			ps = append(ps, Param{Name: r + "e_score_correction_bias", Shape: []int{c.Experts}, Group: GroupRouter, Layer: l, Expert: -1, Buffer: true})
		}
		if c.FusedExperts {
			c.fusedExpertParams(m+"experts.", l, add, split)
		} else {
			c.expertParams(m+"experts.", l, n, add, split)
		}
		if c.SharedExperts > 0 {
			s := m + n.Shared + "."
			w := c.SharedExperts * c.SharedFFN
			add(s+"gate_proj.weight", GroupShared, l, -1, w, D)
			split(TPDim0)
			add(s+"up_proj.weight", GroupShared, l, -1, w, D)
			split(TPDim0)
			add(s+"down_proj.weight", GroupShared, l, -1, D, w)
			split(TPDim1)
			if c.SharedGated {
				add(m+"shared_expert_gate.weight", GroupShared, l, -1, 1, D)
			}
		}
	}
	add("model.norm.weight", GroupNorm, -1, -1, D)
	if !c.TiedEmbeddings {
		add("lm_head.weight", GroupLMHead, -1, -1, V, D)
		split(TPDim0)
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
func (c *Config) attnParams(a string, l int, add paramAdder, split func(TPSplit)) {
	D, H, G, d := c.Hidden, c.Heads, c.KVHeads, c.HeadDim
	for _, p := range []struct {
		name string
		out  int
	}{{"q_proj", H * d}, {"k_proj", G * d}, {"v_proj", G * d}} {
		add(a+p.name+".weight", GroupAttention, l, -1, p.out, D)
		split(TPDim0)
		if c.QKVBias {
			add(a+p.name+".bias", GroupAttention, l, -1, p.out)
			split(TPDim0)
		}
	}
	add(a+"o_proj.weight", GroupAttention, l, -1, D, H*d)
	split(TPDim1)
	if c.OProjBias {
		// Added after the row-wise reduction: whole on every tp rank.
		add(a+"o_proj.bias", GroupAttention, l, -1, D)
	}
	if c.AttnSinks {
		add(a+"sinks", GroupAttention, l, -1, H)
		split(TPDim0) // one per query head, cut with the heads
	}
	switch c.QKNorm {
	case QKNormHead:
		add(a+"q_norm.weight", GroupNorm, l, -1, d)
		add(a+"k_norm.weight", GroupNorm, l, -1, d)
	case QKNormFull:
		add(a+"q_norm.weight", GroupNorm, l, -1, H*d)
		add(a+"k_norm.weight", GroupNorm, l, -1, G*d)
	}
}

// expertParams adds each routed expert's gate, up and down projections
// (and their biases) under prefix x ("model.layers.l.mlp.experts."), one
// module per expert as Qwen3-MoE names them. They are split by
// Layout.ExpertTP, not tp.
func (c *Config) expertParams(x string, l int, n TensorNames, add paramAdder, split func(TPSplit)) {
	D, F := c.Hidden, c.ExpertFFN
	for e := 0; e < c.Experts; e++ {
		p := x + strconv.Itoa(e) + "."
		for _, t := range []struct {
			name    string
			out, in int
			s       TPSplit
			biasCut TPSplit
		}{{n.ExpertGate, F, D, TPDim0, TPDim0}, {n.ExpertUp, F, D, TPDim0, TPDim0}, {n.ExpertDown, D, F, TPDim1, TPReplicated}} {
			add(p+t.name+".weight", GroupRouted, l, e, t.out, t.in)
			split(t.s)
			if c.ExpertBias {
				add(p+t.name+".bias", GroupRouted, l, e, t.out)
				split(t.biasCut)
			}
		}
	}
}
