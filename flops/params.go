package flops

import (
	"github.com/moescope/moescope/moe"
)

// Params are parameter counts (elements; buffers such as the sigmoid
// router's selection bias excluded).
type Params struct {
	Total  int64 // every trained parameter, both embeddings when untied
	Active int64 // per token: every non-routed parameter (embedding and LM head included), top-k routed experts, all shared experts
	// ByGroup and ActiveByGroup split Total and Active by moe.ParamGroup.
	ByGroup       map[moe.ParamGroup]int64
	ActiveByGroup map[moe.ParamGroup]int64
}

// CountParams counts cfg's parameters in closed form, overflow-checked:
//
//	embedding  V·D;  LM head V·D unless tied;  final norm D
//	per layer  attention D·q + 2·D·kv + q·D (+ q + 2·kv biases, + D o_proj
//	           bias, + H sinks), or under MLA
//	           (H heads, Rq, Rkv latent ranks, n, r, v head dims)
//	           D·H·(n+r) without a query latent, else Rq·D + H·(n+r)·Rq,
//	           + (Rkv+r)·D + H·(n+v)·Rkv + H·v·D, norms + Rq (if any) + Rkv
//	           norms 2·D (+ 2·d per-head QK-norm, or q + kv full-width)
//	           dense FFN 3·Fd·D
//	           MoE: router E·D (+ E bias), routed E·(3·F·D + b) (active
//	           K·(3·F·D + b)), b = 2·F + D expert biases when present,
//	                shared 3·S·D (+ D for the sigmoid gate)
//
// with q = H·d, kv = G·d, S = SharedExperts·SharedFFN. It agrees with
// summing cfg.Params() (tested) but needs no tensor list.
func CountParams(cfg *moe.Config) (Params, error) {
	if err := cfg.Validate(); err != nil {
		return Params{}, err
	}
	var c checked
	D, V := int64(cfg.Hidden), int64(cfg.Vocab)
	q, kv := c.mul(int64(cfg.Heads), int64(cfg.HeadDim)), c.mul(int64(cfg.KVHeads), int64(cfg.HeadDim))
	g := map[moe.ParamGroup]int64{}
	act := map[moe.ParamGroup]int64{}
	both := func(grp moe.ParamGroup, n int64) {
		g[grp] = c.add(g[grp], n)
		act[grp] = c.add(act[grp], n)
	}
	both(moe.GroupEmbedding, c.mul(V, D))
	if !cfg.TiedEmbeddings {
		both(moe.GroupLMHead, c.mul(V, D))
	}
	both(moe.GroupNorm, D)
	attn := c.add(c.mul(2, q, D), c.mul(2, kv, D))
	if cfg.QKVBias {
		attn = c.add(attn, q, c.mul(2, kv))
	}
	if cfg.OProjBias {
		attn = c.add(attn, D)
	}
	if cfg.AttnSinks {
		attn = c.add(attn, int64(cfg.Heads))
	}
	norms := c.mul(2, D)
	if cfg.IsMLA() {
		attn, norms = mlaParams(&c, cfg)
	}
	switch cfg.QKNorm {
	case moe.QKNormHead:
		norms = c.add(norms, c.mul(2, int64(cfg.HeadDim)))
	case moe.QKNormFull:
		norms = c.add(norms, q, kv)
	}
	E, K, F := int64(cfg.Experts), int64(cfg.TopK), int64(cfg.ExpertFFN)
	expert, router := c.mul(3, F, D), c.mul(E, D)
	if cfg.ExpertBias {
		expert = c.add(expert, c.mul(2, F), D)
	}
	if cfg.RouterBias {
		router = c.add(router, E)
	}
	S := c.mul(int64(cfg.SharedExperts), int64(cfg.SharedFFN))
	shared := c.mul(3, S, D)
	if cfg.SharedGated {
		shared = c.add(shared, D)
	}
	for l := 0; l < cfg.Layers && c.err == nil; l++ {
		both(moe.GroupAttention, attn)
		both(moe.GroupNorm, norms)
		if !cfg.MoELayer[l] {
			both(moe.GroupDenseFFN, c.mul(3, int64(cfg.DenseFFN), D))
			continue
		}
		both(moe.GroupRouter, router)
		g[moe.GroupRouted] = c.add(g[moe.GroupRouted], c.mul(E, expert))
		act[moe.GroupRouted] = c.add(act[moe.GroupRouted], c.mul(K, expert))
		if S > 0 {
			both(moe.GroupShared, shared)
		}
	}
	p := Params{ByGroup: g, ActiveByGroup: act}
	for _, grp := range moe.Groups() {
		p.Total = c.add(p.Total, g[grp])
		p.Active = c.add(p.Active, act[grp])
	}
	if c.err != nil {
		return Params{}, c.err
	}
	return p, nil
}

// mlaParams is one MLA layer's attention parameters and its norms (the two
// block norms and the latent ones), in CountParams' closed form.
func mlaParams(c *checked, cfg *moe.Config) (attn, norms int64) {
	m := cfg.MLA
	D, H := int64(cfg.Hidden), int64(cfg.Heads)
	Rq, Rkv := int64(m.QRank), int64(m.KVRank)
	qk := c.mul(H, int64(m.Nope+m.Rope))
	norms = c.add(c.mul(2, D), Rq, Rkv)
	q := c.mul(D, qk)
	if Rq > 0 {
		q = c.add(c.mul(Rq, D), c.mul(qk, Rq))
	}
	attn = c.add(q, c.mul(Rkv+int64(m.Rope), D), c.mul(H, int64(m.Nope+m.V), Rkv), c.mul(H, int64(m.V), D))
	return attn, norms
}
