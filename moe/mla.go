package moe

import "fmt"

// MLA is multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 §2.1;
// DeepSeek-V3, Kimi-K2, Moonlight), in force when KVRank > 0. Queries and
// keys have a non-rotated part of Nope dims and a rotated part of Rope
// dims per head; values have V dims. With T tokens, D hidden, H heads,
// Rq = QRank and Rkv = KVRank, the attention of one block is
//
//	q   = q_proj(x)                                    D → H·(Nope+Rope)   (QRank = 0)
//	q   = q_b_proj(RMSNorm(q_a_proj(x)))               D → Rq → H·(Nope+Rope)
//	c   = kv_a_proj_with_mqa(x)                        D → Rkv + Rope
//	kv  = kv_b_proj(RMSNorm(c[:Rkv]))                  Rkv → H·(Nope+V)
//	q_h = [q_nope_h, rope(q_rope_h)],  k_h = [k_nope_h, rope(c[Rkv:])]   (one rotated key shared by all heads)
//	o   = o_proj(softmax(scale·q_h·k_hᵀ + mask)·v_h)   H·V → D
//
// as transformers' DeepseekV3Attention and DeepseekV2Attention compute it
// (modeling_deepseek_v3.py, transformers 00b676f8; modeling_deepseek_v2.py,
// transformers 0233e509). Config.HeadDim is the q·k head dim Nope+Rope and
// Config.KVHeads equals Config.Heads: the key and value heads after kv_b_proj.
type MLA struct {
	QRank  int `json:"q_lora_rank"`      // 0: queries by one q_proj, no latent
	KVRank int `json:"kv_lora_rank"`     // 0: no MLA
	Nope   int `json:"qk_nope_head_dim"` // per-head q·k dims without RoPE
	Rope   int `json:"qk_rope_head_dim"` // per-head q·k dims with RoPE (even)
	V      int `json:"v_head_dim"`       // per-head value dims
	// NormEps is the ε of the two latent RMSNorms (q_a_layernorm,
	// kv_a_layernorm): transformers builds them with the class default
	// 1e-6, not rms_norm_eps.
	NormEps float64 `json:"latent_norm_eps"`
}

// IsMLA reports whether attention is multi-head latent attention.
func (c *Config) IsMLA() bool { return c.MLA.KVRank > 0 }

// VHeadDim is the per-head value width: MLA.V under MLA, else HeadDim.
func (c *Config) VHeadDim() int {
	if c.IsMLA() {
		return c.MLA.V
	}
	return c.HeadDim
}

// KVRotaryHeads is the number of key heads RoPE rotates: one shared rotated
// key under MLA, KVHeads otherwise.
func (c *Config) KVRotaryHeads() int {
	if c.IsMLA() {
		return 1
	}
	return c.KVHeads
}

// validateMLA checks the latent ranks and head dims, and that the fields
// the MLA block does not read are in their neutral state.
func (c *Config) validateMLA(e *fieldErrors) {
	m := c.MLA
	if !c.IsMLA() {
		if m != (MLA{}) {
			e.bad("mla.kv_lora_rank", m.KVRank, "must be ≥ 1 when any other mla field is set")
		}
		return
	}
	e.pos("mla.kv_lora_rank", m.KVRank)
	if m.QRank < 0 || m.QRank > MaxDim {
		e.bad("mla.q_lora_rank", m.QRank, fmt.Sprintf("must be 0 (no query latent) or in [1, %d]", MaxDim))
	}
	e.pos("mla.qk_nope_head_dim", m.Nope)
	e.pos("mla.v_head_dim", m.V)
	if m.Rope < 2 || m.Rope > MaxDim || m.Rope%2 != 0 {
		e.bad("mla.qk_rope_head_dim", m.Rope, fmt.Sprintf("must be even and in [2, %d]", MaxDim))
	}
	if c.HeadDim != m.Nope+m.Rope {
		e.bad("head_dim", c.HeadDim, fmt.Sprintf("must be qk_nope_head_dim + qk_rope_head_dim = %d under MLA", m.Nope+m.Rope))
	}
	if c.KVHeads != c.Heads {
		e.bad("kv_heads", c.KVHeads, fmt.Sprintf("must equal heads = %d under MLA (kv_b_proj makes one key and value per head)", c.Heads))
	}
	if c.QKNorm != QKNormNone {
		e.bad("qk_norm", c.QKNorm, `must be "none" under MLA (its norms are the latent ones)`)
	}
	if c.QKVBias {
		e.bad("qkv_bias", c.QKVBias, "must be false under MLA")
	}
	if c.RotaryFraction != 1 {
		e.bad("rotary_fraction", c.RotaryFraction, "must be 1 under MLA (qk_rope_head_dim says what is rotated)")
	}
	if !(m.NormEps > 0 && m.NormEps < 1) {
		e.bad("mla.latent_norm_eps", m.NormEps, "must be in (0, 1)")
	}
}

// mlaLinears lists an MLA block's attention mm/linear calls in the order
// torchtitan's deepseek_v3 Attention.forward makes them (wq or wq_a, wq_b;
// wkv_a, wkv_b; wo), which is the order selective checkpointing counts.
func mlaLinears(c *Config) []Op {
	if c.MLA.QRank == 0 {
		return []Op{OpQProj, OpKVAProj, OpKVBProj, OpOProj}
	}
	return []Op{OpQAProj, OpQBProj, OpKVAProj, OpKVBProj, OpOProj}
}

// mlaAttention adds the attention half of an MLA block under policy none,
// after the block's input: the input norm's rstd; the normed input, kept
// once under the first projection that reads it (q_proj or q_a_proj;
// kv_a_proj reads the same tensor); each latent RMSNorm's input and rstd
// and its output as the next projection's input; and flash attention's q,
// k [T, H·(nope+rope)], v [T, H·v], output [T, H·v] and lse. RoPE keeps
// nothing (its cos/sin are constants), and the attention output is also
// o_proj's input, listed once.
func (s *savedList) mlaAttention() {
	c, T, m := s.c, s.T, s.c.MLA
	H := int64(c.Heads)
	qk, v := H*int64(c.HeadDim), H*int64(m.V)
	s.add(OpAttnNorm, SavedRstd, T, F32)
	if m.QRank == 0 {
		s.add(OpQProj, SavedInput, T*int64(c.Hidden), s.act)
	} else {
		s.add(OpQAProj, SavedInput, T*int64(c.Hidden), s.act)
		s.add(OpQANorm, SavedInput, T*int64(m.QRank), s.act)
		s.add(OpQANorm, SavedRstd, T, F32)
		s.add(OpQBProj, SavedInput, T*int64(m.QRank), s.act)
	}
	s.add(OpKVANorm, SavedInput, T*int64(m.KVRank), s.act)
	s.add(OpKVANorm, SavedRstd, T, F32)
	s.add(OpKVBProj, SavedInput, T*int64(m.KVRank), s.act)
	s.add(OpAttn, SavedQ, T*qk, s.act)
	s.add(OpAttn, SavedK, T*qk, s.act)
	s.add(OpAttn, SavedV, T*v, s.act)
	s.add(OpAttn, SavedOutput, T*v, s.act)
	s.add(OpAttn, SavedLSE, T*H, F32)
}
