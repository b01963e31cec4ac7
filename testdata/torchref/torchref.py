#!/usr/bin/python3
"""Independent PyTorch reference for moescope's model family.

Runs with Debian's python3-torch (1.13, CPU) and nothing else:

    /usr/bin/python3 testdata/torchref/torchref.py [OUTDIR [CASE ...]]   (default: this script's folder, every case)

For each tiny configuration below it writes OUTDIR/<name>/:
    config.json          a Hugging Face config.json of that model_type
    model*.safetensors   the weights under HF tensor names (written by hand: 8-byte little-endian
                         header length, JSON header, raw data); some configs store BF16 or F16, one is
                         sharded with model.safetensors.index.json, as transformers writes them
    tokens.json          an array of equal-length token-id sequences
    expected.json        loss (cross-entropy), aux_loss (HF load_balancing_loss_func), total_loss (the
                         loss HF trains on: + router_aux_loss_coef·aux_loss only when
                         output_router_logits), and the smallest routing margin; when the aux loss is
                         added also "shifted": the same under torchtitan's input convention
                         (inputs tokens[:, :-1]: the last token is not routed), whose gradients are in
                         grads_shifted.safetensors
    grads.safetensors    d total_loss / d weight for every tensor of the checkpoint, F32 (buffers such
                         as e_score_correction_bias take no gradient and are written as zeros)

The model follows transformers' modeling files (modeling_qwen3_moe.py, modeling_qwen2_moe.py,
modeling_mixtral.py, modeling_olmoe.py, modeling_glm4_moe.py, modeling_qwen3.py; for multi-head
latent attention modeling_deepseek_v3.py at transformers 00b676f8 and modeling_deepseek_v2.py at
0233e509) as read in 2026,
and DeepSeek-MoE's remote code modeling_deepseek.py (huggingface.co/deepseek-ai/deepseek-moe-16b-base,
revision d99310132b6997599a6f8111f23395642ae71469), whose MoEGate adds its own aux loss (aux_loss_alpha
times a per-layer, per-sequence loss with seq_aux) through AddAuxiliaryLoss: its gradient is trained on
while the returned loss stays the cross-entropy, so for it expected.json's aux_loss is that sum over
layers and total_loss = loss + aux_loss_alpha·aux_loss, what the gradients are of. It is our own
code. Arithmetic is float64 from the stored (float32/bf16/f16-rounded) weights, so the references
are exact to float64 rounding. Seeds are fixed; routing margins are checked so that
float32 implementations select the same experts.
"""
import json
import math
import os
import struct
import sys

import torch

torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)  # deterministic reductions: regenerating gives identical files

# ---------------------------------------------------------------------------------------------
# Configurations: HF config.json contents. Sizes are tiny so the committed files stay small.

BASE = {
    "hidden_act": "silu",
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "vocab_size": 24,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
}

# DeepSeek-V3 (transformers' DeepseekV3 classes): multi-head latent attention with a query latent
# (q_lora_rank 6), kv_lora_rank 5, q·k heads of 4 + 4 rotated dims and value heads of 3,
# interleaved RoPE; sigmoid routing with e_score_correction_bias over 4 groups of 2 (best 2 groups, a
# group scored by its two best), top-3 renormalized with +1e-20, × 2.5; one shared expert; a dense
# first layer; one MTP layer in the config, which the HF model ignores.
MLA_V3 = dict({k: v for k, v in BASE.items() if k not in ("head_dim", "num_key_value_heads")},
              model_type="deepseek_v3", num_hidden_layers=3, intermediate_size=20, moe_intermediate_size=6,
              n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1, n_group=4, topk_group=2,
              routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1, q_lora_rank=6,
              kv_lora_rank=5, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=3, rope_interleave=True,
              scoring_func="sigmoid", topk_method="noaux_tc", num_nextn_predict_layers=1,
              attention_bias=False, rope_scaling=None, _dtype="F32")

CONFIGS = {
    # Dense Qwen3: per-head QK-norm, tied embeddings; weights stored as BF16.
    "dense": dict(BASE, model_type="qwen3", intermediate_size=20, tie_word_embeddings=True,
                  attention_bias=False, _dtype="BF16"),
    # Qwen3-MoE: a dense first layer (mlp_only_layers), softmax top-2 of 4 renormalized;
    # sharded checkpoint with an index.
    "moe": dict(BASE, model_type="qwen3_moe", intermediate_size=20, moe_intermediate_size=8,
                num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0],
                decoder_sparse_step=1, output_router_logits=False, router_aux_loss_coef=0.001,
                attention_bias=False, _dtype="F32", _shards=2),
    # Qwen2-MoE: q/k/v biases, no renormalization, a sigmoid-gated shared expert; stored as F16.
    "shared": dict(BASE, model_type="qwen2_moe", intermediate_size=20, moe_intermediate_size=8,
                   shared_expert_intermediate_size=12, num_experts=4, num_experts_per_tok=2,
                   norm_topk_prob=False, mlp_only_layers=[], decoder_sparse_step=1,
                   output_router_logits=False, router_aux_loss_coef=0.001, qkv_bias=True, _dtype="F16"),
    # GLM-4.5: sigmoid scores, e_score_correction_bias for selection, grouped top-k (4 groups of 2,
    # best 2 groups), routed_scaling_factor, one ungated shared expert, a dense first layer, partial
    # rotary (half of head_dim), q/k/v biases.
    "sigmoid": dict(BASE, model_type="glm4_moe", intermediate_size=20, moe_intermediate_size=6,
                    n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1, n_group=4,
                    topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
                    first_k_dense_replace=1, partial_rotary_factor=0.5, attention_bias=True,
                    use_qk_norm=False, rms_norm_eps=1e-5, _dtype="F32"),
    # Mixtral with a 3-token sliding window on every layer (sequence of 10), w1/w2/w3 names.
    "window": dict(BASE, model_type="mixtral", intermediate_size=8, num_local_experts=4,
                   num_experts_per_tok=2, sliding_window=3, output_router_logits=False,
                   router_aux_loss_coef=0.02, rms_norm_eps=1e-5, rope_theta=1e6, _dtype="F32", _seq=10),
    # OLMoE with the aux loss on: full-width QK-norm, top-2 of 4 without renormalization.
    "aux": dict(BASE, model_type="olmoe", intermediate_size=8, num_experts=4, num_experts_per_tok=2,
                norm_topk_prob=False, output_router_logits=True, router_aux_loss_coef=0.05,
                rms_norm_eps=1e-5, attention_bias=False, _dtype="F32"),
    # Grouped-query attention with 4 query heads on 2 KV heads (head h reads KV head h // 2), longer
    # and more sequences, Qwen3-MoE without renormalization and with the aux loss on.
    "gqa": dict(BASE, model_type="qwen3_moe", num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                intermediate_size=20, moe_intermediate_size=8, num_experts=4, num_experts_per_tok=2,
                norm_topk_prob=False, mlp_only_layers=[], decoder_sparse_step=1, output_router_logits=True,
                router_aux_loss_coef=0.01, attention_bias=False, _dtype="F32", _seq=12, _batch=3),
    # DeepSeek-MoE: a dense first layer then two MoE layers (top-2 of 6, renormalized with MoEGate's
    # 1e-20), two shared experts fused into one MLP, and MoEGate's per-sequence aux loss over three
    # sequences (aux_loss_alpha large enough to move the gradients). Its attention has no head_dim key
    # (DeepseekAttention uses hidden_size // num_attention_heads).
    "deepseek": dict({k: v for k, v in BASE.items() if k != "head_dim"}, model_type="deepseek",
                     num_hidden_layers=3, intermediate_size=20, moe_intermediate_size=6, n_routed_experts=6,
                     num_experts_per_tok=2, n_shared_experts=2, first_k_dense_replace=1, moe_layer_freq=1,
                     norm_topk_prob=True, scoring_func="softmax", aux_loss_alpha=0.1, seq_aux=True,
                     attention_bias=False, _dtype="F32", _batch=3),
    # DeepSeek-V3: MLA_V3 above.
    "mla_v3": MLA_V3,
    # DeepSeek-V3 with YaRN rope scaling: mla_v3 with 8 rotated dims (4 frequencies), rope_theta 100 so that
    # every frequency turns visibly over 12 positions, and a correction range (original context 64, β 32
    # and 1) that keeps the fastest pair, interpolates the slowest by the factor 4 and blends the two
    # between; mscale 1 over mscale_all_dim 0.5 makes cos and sin carry an attention factor ≠ 1, and the
    # softmax scale takes m(4, 0.5)².
    "yarn_v3": dict(MLA_V3, qk_rope_head_dim=8, rope_theta=100.0, max_position_embeddings=256,
                    rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.5},
                    _seq=12),
    # YaRN on standard attention: GLM-4.5 (the "sigmoid" case's routing) with half of each 8-dim head
    # rotated (partial_rotary_factor 0.5: 2 frequencies), rope_theta 30, factor 4 at an original context
    # of 64 without truncation (a ramp of 0 and 0.73), attention_factor left to its default 0.1·ln 4 + 1 on
    # cos and sin, and no softmax-scale change (only DeepSeek-V3's attention has one).
    "yarn_moe": dict(BASE, model_type="glm4_moe", intermediate_size=20, moe_intermediate_size=6,
                     n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1, n_group=4,
                     topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
                     first_k_dense_replace=1, partial_rotary_factor=0.5, attention_bias=True,
                     use_qk_norm=False, rms_norm_eps=1e-5, rope_theta=30.0, max_position_embeddings=256,
                     rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                   "truncate": False},
                     _dtype="F32", _seq=12),
    # DeepSeek-V2 (transformers' DeepseekV2 classes): MLA without a query latent (q_proj), value heads of
    # 7 dims wider than the q·k heads (4 + 2 rotated), complex-number RoPE; softmax group-limited greedy
    # top-2 over 3 groups of 2 (best 2 groups, a group scored by its best expert), × 1.5 and never
    # renormalized; two shared experts; a dense first layer; BF16 weights.
    "mla_v2": dict({k: v for k, v in BASE.items() if k not in ("head_dim", "num_key_value_heads")},
                   model_type="deepseek_v2", num_hidden_layers=3, intermediate_size=20, moe_intermediate_size=6,
                   n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=2, n_group=3, topk_group=2,
                   topk_method="group_limited_greedy", routed_scaling_factor=1.5, norm_topk_prob=False,
                   first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=6, qk_nope_head_dim=4,
                   qk_rope_head_dim=2, v_head_dim=7, scoring_func="softmax", attention_bias=False,
                   rope_scaling=None, _dtype="BF16"),
}

BATCH, SEQ = 2, 8
MIN_MARGIN = 1e-3  # smallest accepted gap between a selected and an unselected routing score

# ---------------------------------------------------------------------------------------------
# Architecture, normalized from the config as each modeling file reads it.


class Arch:
    def __init__(self, c):
        t = c["model_type"]
        self.type = t
        self.V, self.D, self.L = c["vocab_size"], c["hidden_size"], c["num_hidden_layers"]
        self.H, self.G = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
        self.d = c.get("head_dim") or self.D // self.H
        self.eps, self.theta = c["rms_norm_eps"], c["rope_theta"]
        self.rot = int(self.d * c.get("partial_rotary_factor", 1.0))
        self.tied = c.get("tie_word_embeddings", False)
        self.qk_norm = {"qwen3": "head", "qwen3_moe": "head", "olmoe": "full"}.get(t, "none")
        if t == "glm4_moe" and c.get("use_qk_norm"):
            self.qk_norm = "head"
        self.qkv_bias = (t == "qwen2_moe" and c.get("qkv_bias", True)) or (t == "glm4_moe" and c.get("attention_bias", False))
        # sliding window: Mixtral applies sliding_window to every layer.
        self.window = [c.get("sliding_window") or 0 if t == "mixtral" else 0 for _ in range(self.L)]
        self.dense_ffn = c.get("intermediate_size")
        self.score, self.bias, self.scale, self.groups, self.topk_groups = "softmax", False, 1.0, 1, 1
        self.shared_ffn, self.shared_gated = 0, False
        self.aux_on = bool(c.get("output_router_logits", False))
        self.aux_coef = c.get("router_aux_loss_coef", 0.0)
        self.seq_aux = False  # DeepSeek-MoE's MoEGate loss instead of HF's load_balancing_loss_func
        # Multi-head latent attention (DeepseekV2Attention, DeepseekV3Attention): the q·k head is
        # qk_nope_head_dim + qk_rope_head_dim, one key and value head per query head after kv_b_proj.
        self.mla = t in ("deepseek_v2", "deepseek_v3")
        if self.mla:
            self.q_rank, self.kv_rank = c.get("q_lora_rank"), c["kv_lora_rank"]
            self.nope, self.rrope, self.vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
            self.d, self.G = self.nope + self.rrope, self.H
            self.interleave = c.get("rope_interleave", True)
        # RoPE scaling: only YaRN (modeling_rope_utils.py _compute_yarn_parameters, transformers 26892c16, which
        # every model type here applies to its cos and sin, or to DeepSeek-V2's complex rotation).
        self.yarn = c.get("rope_scaling")
        if self.yarn is not None:
            assert self.yarn.get("rope_type", self.yarn.get("type")) == "yarn", self.yarn
        if t in ("qwen3", "llama"):
            self.moe_layers = [False] * self.L
            return
        self.K = c["num_experts_per_tok"]
        self.norm_topk = c.get("norm_topk_prob", False)
        if t in ("qwen3_moe", "qwen2_moe"):
            self.E, self.F = c["num_experts"], c["moe_intermediate_size"]
            step, only = c.get("decoder_sparse_step", 1), set(c.get("mlp_only_layers", []))
            self.moe_layers = [i not in only and (i + 1) % step == 0 for i in range(self.L)]
            if t == "qwen2_moe":
                self.shared_ffn, self.shared_gated = c["shared_expert_intermediate_size"], True
        elif t == "mixtral":
            self.E, self.F, self.norm_topk = c["num_local_experts"], c["intermediate_size"], True
            self.moe_layers = [True] * self.L
        elif t == "olmoe":
            self.E, self.F = c["num_experts"], c["intermediate_size"]
            self.moe_layers = [True] * self.L
        elif t == "glm4_moe":
            self.E, self.F = c["n_routed_experts"], c["moe_intermediate_size"]
            self.moe_layers = [i >= c.get("first_k_dense_replace", 1) for i in range(self.L)]
            self.shared_ffn = c["moe_intermediate_size"] * c.get("n_shared_experts", 1)
            self.score, self.bias = "sigmoid", True
            self.scale = c.get("routed_scaling_factor", 1.0)
            self.groups, self.topk_groups = c.get("n_group", 1), c.get("topk_group", 1)
            self.aux_on = False  # Glm4MoeForCausalLM has no load-balancing loss
        elif t == "deepseek":
            # DeepseekDecoderLayer: DeepseekMoE when n_routed_experts is set, i >= first_k_dense_replace
            # and i % moe_layer_freq == 0; DeepseekMoE.shared_experts is one DeepseekMLP of
            # moe_intermediate_size * n_shared_experts. MoEGate: softmax scores, greedy top-k, weights
            # renormalized (+1e-20) only when top_k > 1 and norm_topk_prob; while training with
            # aux_loss_alpha > 0 it returns alpha * the seq_aux loss (DeepseekConfig defaults: alpha 0.001,
            # seq_aux True, first_k_dense_replace 0, moe_layer_freq 1, norm_topk_prob False).
            assert c.get("scoring_func", "softmax") == "softmax" and c.get("seq_aux", True)
            self.E, self.F = c["n_routed_experts"], c["moe_intermediate_size"]
            first, freq = c.get("first_k_dense_replace", 0), c.get("moe_layer_freq", 1)
            self.moe_layers = [i >= first and i % freq == 0 for i in range(self.L)]
            self.shared_ffn = c["moe_intermediate_size"] * (c.get("n_shared_experts") or 0)
            self.aux_coef = c.get("aux_loss_alpha", 0.001)
            self.aux_on, self.seq_aux = self.aux_coef > 0, True
        elif self.mla:
            # DeepseekV*DecoderLayer: MoE from first_k_dense_replace on (moe_layer_freq is not read);
            # shared experts one MLP of moe_intermediate_size * n_shared_experts; no aux loss.
            self.E, self.F = c["n_routed_experts"], c["moe_intermediate_size"]
            self.moe_layers = [i >= c["first_k_dense_replace"] for i in range(self.L)]
            self.shared_ffn = c["moe_intermediate_size"] * c["n_shared_experts"]
            self.scale = c["routed_scaling_factor"]
            self.groups, self.topk_groups = c.get("n_group") or 1, c.get("topk_group") or 1
            self.aux_on = False
            if t == "deepseek_v3":  # DeepseekV3TopkRouter, as glm4_moe's
                self.score, self.bias = "sigmoid", True
            else:  # DeepseekV2Moe.route_tokens_to_experts
                self.score = "softmax_v2"
                if c.get("topk_method", "greedy") == "greedy":
                    self.groups, self.topk_groups = 1, 1
        else:
            raise ValueError(t)

    def mla_names(self, a):
        """An MLA layer's attention tensors under prefix a, in moescope's order."""
        H, d, D, r = self.H, self.d, self.D, self.kv_rank
        if self.q_rank:
            out = [(a + "q_a_proj.weight", (self.q_rank, D), "weight"), (a + "q_a_layernorm.weight", (self.q_rank,), "norm"),
                   (a + "q_b_proj.weight", (H * d, self.q_rank), "weight")]
        else:
            out = [(a + "q_proj.weight", (H * d, D), "weight")]
        return out + [(a + "kv_a_proj_with_mqa.weight", (r + self.rrope, D), "weight"),
                      (a + "kv_a_layernorm.weight", (r,), "norm"),
                      (a + "kv_b_proj.weight", (H * (self.nope + self.vd), r), "weight"),
                      (a + "o_proj.weight", (D, H * self.vd), "weight")]

    def names(self):
        """(name, shape, kind) in moescope's order; kind: 'norm', 'bias', 'buffer' or 'weight'."""
        t = self.type
        mlp = "block_sparse_moe" if t == "mixtral" else "mlp"
        g, u, dn = ("w1", "w3", "w2") if t == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        shared = "shared_expert" if t == "qwen2_moe" else "shared_experts"
        H, G, d, D = self.H, self.G, self.d, self.D
        out = [("model.embed_tokens.weight", (self.V, D), "weight")]
        for l in range(self.L):
            p = f"model.layers.{l}."
            a = p + "self_attn."
            out.append((p + "input_layernorm.weight", (D,), "norm"))
            for proj, rows in () if self.mla else (("q", H * d), ("k", G * d), ("v", G * d)):
                out.append((a + proj + "_proj.weight", (rows, D), "weight"))
                if self.qkv_bias:
                    out.append((a + proj + "_proj.bias", (rows,), "bias"))
            out += self.mla_names(a) if self.mla else [(a + "o_proj.weight", (D, H * d), "weight")]
            if self.qk_norm == "head":
                out += [(a + "q_norm.weight", (d,), "norm"), (a + "k_norm.weight", (d,), "norm")]
            elif self.qk_norm == "full":
                out += [(a + "q_norm.weight", (H * d,), "norm"), (a + "k_norm.weight", (G * d,), "norm")]
            out.append((p + "post_attention_layernorm.weight", (D,), "norm"))
            m = p + mlp + "."
            if not self.moe_layers[l]:
                dm = p + "mlp."
                out += [(dm + "gate_proj.weight", (self.dense_ffn, D), "weight"),
                        (dm + "up_proj.weight", (self.dense_ffn, D), "weight"),
                        (dm + "down_proj.weight", (D, self.dense_ffn), "weight")]
                continue
            out.append((m + "gate.weight", (self.E, D), "weight"))
            if self.bias:
                out.append((m + "gate.e_score_correction_bias", (self.E,), "buffer"))
            for e in range(self.E):
                x = f"{m}experts.{e}."
                out += [(x + g + ".weight", (self.F, D), "weight"), (x + u + ".weight", (self.F, D), "weight"),
                        (x + dn + ".weight", (D, self.F), "weight")]
            if self.shared_ffn:
                s = m + shared + "."
                out += [(s + "gate_proj.weight", (self.shared_ffn, D), "weight"),
                        (s + "up_proj.weight", (self.shared_ffn, D), "weight"),
                        (s + "down_proj.weight", (D, self.shared_ffn), "weight")]
                if self.shared_gated:
                    out.append((m + "shared_expert_gate.weight", (1, D), "weight"))
        out.append(("model.norm.weight", (D,), "norm"))
        if not self.tied:
            out.append(("lm_head.weight", (self.V, D), "weight"))
        return out

# ---------------------------------------------------------------------------------------------
# The model (float64, autograd).


def rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def get_mscale(scale, m=1.0):
    """YaRN's magnitude correction 0.1·m·ln(scale) + 1 (1 for scale ≤ 1)."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def inv_freq(rot, theta, yarn=None):
    """RoPE's rot/2 inverse frequencies and the factor cos and sin are multiplied by. With YaRN (our reading
    of transformers' _compute_yarn_parameters): a ramp over the pair index between the dimensions where
    β_fast and β_slow rotations fit the original context, keeping the plain frequency below it and dividing
    by factor above it; the factor is attention_factor, else m(factor, mscale) / m(factor, mscale_all_dim)
    when both are set, else m(factor)."""
    plain = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    if yarn is None:
        return plain, 1.0
    factor, orig = yarn["factor"], yarn.get("original_max_position_embeddings")

    def dim_of(beta):
        return rot * math.log(orig / (beta * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = dim_of(yarn.get("beta_fast") or 32), dim_of(yarn.get("beta_slow") or 1)
    if yarn.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, rot - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(rot // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    af = yarn.get("attention_factor")
    if af is None:
        ms, msa = yarn.get("mscale"), yarn.get("mscale_all_dim")
        af = get_mscale(factor, ms) / get_mscale(factor, msa) if ms and msa else get_mscale(factor)
    return plain / factor * ramp + plain * (1 - ramp), af


def rope(x, rot, theta, yarn=None):
    """x: [B, heads, S, d]; rotates the first rot dims, HF's non-interleaved layout."""
    S = x.shape[2]
    inv, af = inv_freq(rot, theta, yarn)
    freqs = torch.outer(torch.arange(S, dtype=torch.float64), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * af, emb.sin() * af
    xr, xp = x[..., :rot], x[..., rot:]
    return torch.cat((xr * cos + rotate_half(xr) * sin, xp), dim=-1)


def rope_interleave(x, theta, yarn=None):
    """DeepSeek-V3's apply_rotary_pos_emb_interleave: regroup the (even, odd) pairs into halves, then
    HF's rotate_half rotation over all of x's dims."""
    b, h, s, d = x.shape
    return rope(x.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d), d, theta, yarn)


def rope_complex(x, theta, yarn=None):
    """DeepSeek-V2's apply_rotary_emb: adjacent pairs as complex numbers times af·e^{i·p·θ_j}."""
    b, h, S, d = x.shape
    inv, af = inv_freq(d, theta, yarn)
    freqs = torch.outer(torch.arange(S, dtype=torch.float64), inv)
    cis = torch.polar(torch.full_like(freqs, af), freqs)
    xc = torch.view_as_complex(x.reshape(b, h, S, d // 2, 2).contiguous())
    return torch.view_as_real(xc * cis).flatten(3)


def causal_softmax_v(s, v):
    S = s.shape[-1]
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    return torch.softmax(s.masked_fill(~(j <= i), float("-inf")), dim=-1) @ v


def mla_attention(a, P, pre, x):
    """DeepseekV3Attention / DeepseekV2Attention (eager, no cache); latent norms at the class default
    eps 1e-6; softmax scale qk_head_dim^-0.5, which DeepseekV3Attention multiplies by
    m(factor, mscale_all_dim)² when rope_scaling has a non-zero mscale_all_dim (V2 does not)."""
    B, S, _ = x.shape
    H, n, r, vd = a.H, a.nope, a.rrope, a.vd
    if a.q_rank:
        q = linear(rmsnorm(linear(x, P, pre + "q_a_proj"), P[pre + "q_a_layernorm.weight"], 1e-6), P, pre + "q_b_proj")
    else:
        q = linear(x, P, pre + "q_proj")
    q_pass, q_rot = torch.split(q.view(B, S, H, n + r).transpose(1, 2), [n, r], dim=-1)
    k_pass, k_rot = torch.split(linear(x, P, pre + "kv_a_proj_with_mqa"), [a.kv_rank, r], dim=-1)
    kv = linear(rmsnorm(k_pass, P[pre + "kv_a_layernorm.weight"], 1e-6), P, pre + "kv_b_proj")
    k_pass, v = torch.split(kv.view(B, S, H, n + vd).transpose(1, 2), [n, vd], dim=-1)
    k_rot = k_rot.view(B, 1, S, r)
    if a.type == "deepseek_v2":
        q_rot, k_rot = rope_complex(q_rot, a.theta, a.yarn), rope_complex(k_rot, a.theta, a.yarn)
    elif a.interleave:
        q_rot, k_rot = rope_interleave(q_rot, a.theta, a.yarn), rope_interleave(k_rot, a.theta, a.yarn)
    else:
        q_rot, k_rot = rope(q_rot, r, a.theta, a.yarn), rope(k_rot, r, a.theta, a.yarn)
    q = torch.cat((q_pass, q_rot), dim=-1)
    k = torch.cat((k_pass, k_rot.expand(B, H, S, r)), dim=-1)
    scale = (n + r) ** -0.5
    if a.type == "deepseek_v3" and a.yarn and a.yarn.get("mscale_all_dim"):
        scale *= get_mscale(a.yarn["factor"], a.yarn["mscale_all_dim"]) ** 2
    o = causal_softmax_v((q @ k.transpose(2, 3)) * scale, v)
    return linear(o.transpose(1, 2).reshape(B, S, H * vd), P, pre + "o_proj")


def linear(x, P, name, bias=False):
    y = x @ P[name + ".weight"].T
    if bias:
        y = y + P[name + ".bias"]
    return y


def attention(a, P, pre, x, window):
    if a.mla:
        return mla_attention(a, P, pre, x)
    B, S, _ = x.shape
    H, G, d = a.H, a.G, a.d
    q = linear(x, P, pre + "q_proj", a.qkv_bias)
    k = linear(x, P, pre + "k_proj", a.qkv_bias)
    v = linear(x, P, pre + "v_proj", a.qkv_bias)
    if a.qk_norm == "full":  # OLMoE: over the whole projection, before splitting heads
        q = rmsnorm(q, P[pre + "q_norm.weight"], a.eps)
        k = rmsnorm(k, P[pre + "k_norm.weight"], a.eps)
    q, k, v = q.view(B, S, H, d), k.view(B, S, G, d), v.view(B, S, G, d)
    if a.qk_norm == "head":  # Qwen3: per head, over d
        q = rmsnorm(q, P[pre + "q_norm.weight"], a.eps)
        k = rmsnorm(k, P[pre + "k_norm.weight"], a.eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q, k = rope(q, a.rot, a.theta, a.yarn), rope(k, a.rot, a.theta, a.yarn)
    k = k.repeat_interleave(H // G, dim=1)
    v = v.repeat_interleave(H // G, dim=1)
    s = (q @ k.transpose(2, 3)) * d ** -0.5
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    allowed = j <= i
    if window:
        allowed = allowed & (j > i - window)  # HF sliding window: i − window < j ≤ i
    s = s.masked_fill(~allowed, float("-inf"))
    o = torch.softmax(s, dim=-1) @ v
    o = o.transpose(1, 2).reshape(B, S, H * d)
    return linear(o, P, pre + "o_proj")


def swiglu(P, pre, x, g="gate_proj", u="up_proj", dn="down_proj"):
    return linear(torch.nn.functional.silu(linear(x, P, pre + g)) * linear(x, P, pre + u), P, pre + dn)


def route(a, logits, bias):
    """Returns (weights [T,K] with gradient, indices [T,K], margin)."""
    T, E, K = logits.shape[0], a.E, a.K
    if a.score == "softmax_v2":
        # DeepseekV2Moe: softmax, group_limited_greedy keeps the topk_group groups with the best single
        # expert (masked_fill 0 elsewhere), top-k of what is left, × routed_scaling_factor.
        probs = torch.softmax(logits, dim=-1)
        per = E // a.groups
        gscore = probs.detach().view(T, a.groups, per).max(dim=-1).values
        gidx = torch.topk(gscore, a.topk_groups, dim=-1)[1]
        gmask = torch.zeros_like(gscore).scatter_(1, gidx, 1.0)
        emask = gmask.unsqueeze(-1).expand(T, a.groups, per).reshape(T, E)
        masked = probs.masked_fill(emask == 0, 0.0)
        w, idx = torch.topk(masked, K, dim=-1)
        gs = torch.sort(gscore, dim=-1, descending=True)[0]
        ms = torch.sort(masked.detach(), dim=-1, descending=True)[0]
        margin = min((gs[:, a.topk_groups - 1] - gs[:, a.topk_groups]).min().item() if a.topk_groups < a.groups else 1.0,
                     (ms[:, K - 1] - ms[:, K]).min().item())
        return w * a.scale, idx, margin
    if a.score == "softmax":
        probs = torch.softmax(logits, dim=-1)
        w, idx = torch.topk(probs, K, dim=-1)
        srt = torch.sort(probs.detach(), dim=-1, descending=True)[0]
        margin = (srt[:, K - 1] - srt[:, K]).min().item() if K < E else 1.0
        if a.type == "deepseek":
            if a.K > 1 and a.norm_topk:  # MoEGate
                w = w / (w.sum(-1, keepdim=True) + 1e-20)
        elif a.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        return w, idx, margin
    s = torch.sigmoid(logits)
    choice = s.detach() + bias
    per = E // a.groups
    gscore = choice.view(T, a.groups, per).topk(2, dim=-1)[0].sum(-1)
    gidx = torch.topk(gscore, a.topk_groups, dim=-1)[1]
    gmask = torch.zeros_like(gscore).scatter_(1, gidx, 1.0)
    emask = gmask.unsqueeze(-1).expand(T, a.groups, per).reshape(T, E)
    masked = choice.masked_fill(emask == 0, 0.0)
    idx = torch.topk(masked, K, dim=-1)[1]
    gs = torch.sort(gscore, dim=-1, descending=True)[0]
    ms = torch.sort(masked, dim=-1, descending=True)[0]
    margin = min((gs[:, a.topk_groups - 1] - gs[:, a.topk_groups]).min().item() if a.topk_groups < a.groups else 1.0,
                 (ms[:, K - 1] - ms[:, K]).min().item())
    w = s.gather(1, idx)
    if a.norm_topk:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return w * a.scale, idx, margin


def moe_block(a, P, pre, x):
    B, S, D = x.shape
    h = x.reshape(B * S, D)
    mlp = pre + ("block_sparse_moe." if a.type == "mixtral" else "mlp.")
    logits = linear(h, P, mlp + "gate")
    bias = P.get(mlp + "gate.e_score_correction_bias")
    w, idx, margin = route(a, logits, bias)
    out = torch.zeros_like(h)
    names = ("w1", "w3", "w2") if a.type == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    for e in range(a.E):
        tok, slot = torch.where(idx == e)
        if tok.numel() == 0:
            continue
        y = swiglu(P, f"{mlp}experts.{e}.", h[tok], *names) * w[tok, slot, None]
        out = out.index_add(0, tok, y)
    if a.shared_ffn:
        if a.shared_gated:
            sh = swiglu(P, mlp + "shared_expert.", h)
            out = out + torch.sigmoid(linear(h, P, mlp + "shared_expert_gate")) * sh
        else:
            out = out + swiglu(P, mlp + "shared_experts.", h)
    return out.view(B, S, D), logits, margin


def load_balancing(a, router_logits):
    """HF load_balancing_loss_func without an attention mask, over all MoE layers at once."""
    if not router_logits:
        return torch.zeros(())
    cat = torch.cat(router_logits, dim=0)
    probs = torch.softmax(cat, dim=-1)
    _, sel = torch.topk(probs, a.K, dim=-1)
    mask = torch.nn.functional.one_hot(sel, a.E).to(torch.float64)  # [N, K, E]
    tokens_per_expert = mask.mean(0)  # [K, E]
    prob_per_expert = probs.mean(0)  # [E]
    return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * a.E


def deepseek_seq_aux(a, router_logits, B, S):
    """DeepSeek-MoE's MoEGate aux loss with seq_aux, summed over the MoE layers (without alpha): per
    layer, ce[b, e] = (# of sequence b's top-k slots choosing e) / (S·K/E) and
    aux = mean_b Σ_e ce[b, e] · mean_t scores[b, t, e]."""
    total = torch.zeros(())
    for logits in router_logits:
        scores = torch.softmax(logits, dim=-1)
        idx = torch.topk(scores, a.K, dim=-1)[1]
        ce = torch.zeros(B, a.E).scatter_add_(1, idx.view(B, -1), torch.ones(B, S * a.K)).div_(S * a.K / a.E)
        total = total + (ce * scores.view(B, S, -1).mean(dim=1)).sum(dim=1).mean()
    return total


def forward(a, P, tokens, shifted=False):
    """HF semantics: every token is an input, labels are the next tokens (the last position has
    none, HF's -100 padding). shifted=True is torchtitan's convention instead: inputs
    tokens[:, :-1], labels tokens[:, 1:]. The cross-entropy is the same; the aux loss differs,
    since HF also routes the last token."""
    if shifted:
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
    else:
        pad = torch.full((tokens.shape[0], 1), -100, dtype=tokens.dtype)
        inputs, labels = tokens, torch.cat((tokens[:, 1:], pad), dim=1)
    x = P["model.embed_tokens.weight"][inputs]
    router, margin = [], 1.0
    for l in range(a.L):
        p = f"model.layers.{l}."
        x = x + attention(a, P, p + "self_attn.", rmsnorm(x, P[p + "input_layernorm.weight"], a.eps), a.window[l])
        h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], a.eps)
        if a.moe_layers[l]:
            y, logits, m = moe_block(a, P, p, h)
            router.append(logits)
            margin = min(margin, m)
        else:
            y = swiglu(P, p + "mlp.", h)
        x = x + y
    x = rmsnorm(x, P["model.norm.weight"], a.eps)
    head = P["model.embed_tokens.weight"] if a.tied else P["lm_head.weight"]
    logits = x @ head.T
    V = logits.shape[-1]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)
    if a.seq_aux:
        aux = deepseek_seq_aux(a, router, inputs.shape[0], inputs.shape[1])
    else:
        aux = load_balancing(a, router) if a.score == "softmax" else torch.zeros(())
    total = ce + a.aux_coef * aux if a.aux_on else ce
    return ce, aux, total, margin

# ---------------------------------------------------------------------------------------------
# Weights, rounding and files.


def round_to(t, dtype):
    if dtype == "F32":
        return t.to(torch.float32).to(torch.float64)
    if dtype == "BF16":
        return t.to(torch.bfloat16).to(torch.float64)
    if dtype == "F16":
        return t.to(torch.float16).to(torch.float64)
    raise ValueError(dtype)


def init_params(a, seed, dtype):
    """Random weights, larger than initializer_range so routing and gradients are not degenerate."""
    g = torch.Generator().manual_seed(seed)
    P = {}
    for name, shape, kind in a.names():
        if kind == "norm":
            v = 1.0 + 0.2 * torch.randn(shape, generator=g)
        elif kind == "bias":
            v = 0.1 * torch.randn(shape, generator=g)
        elif kind == "buffer":
            v = 0.05 * torch.randn(shape, generator=g)
        else:
            fan_in = shape[-1]
            v = torch.randn(shape, generator=g) * (1.0 if name.endswith("embed_tokens.weight") else 1.2 / math.sqrt(fan_in))
        # e_score_correction_bias stays float32 in HF (_keep_in_fp32_modules_strict).
        P[name] = round_to(v, "F32" if kind == "buffer" else dtype)
    return P


def tensor_bytes(t, dtype):
    if dtype == "F32":
        return t.detach().to(torch.float32).contiguous().numpy().tobytes()
    if dtype == "BF16":
        return t.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
    if dtype == "F16":
        return t.detach().to(torch.float16).contiguous().numpy().tobytes()
    raise ValueError(dtype)


def write_safetensors(path, items):
    """items: list of (name, tensor, dtype). Hand-written safetensors with {"format": "pt"} metadata."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t, dtype in items:
        b = tensor_bytes(t, dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def seeded_case(cfg, init_params, forward, batch, seq, min_margin, what, reset=None):
    """The first seed from 1000 whose parameters and tokens give forward a routing margin of at least min_margin
    (so a rounding difference cannot flip a top-k choice), with its gradients: (P, tokens, ce, margin, seed).
    reset, if given, runs before each forward (a script's counters)."""
    for seed in range(1000, 1200):
        P = init_params(cfg, seed)
        tokens = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(seed + 7))
        for v in P.values():
            v.requires_grad_(True)
        if reset:
            reset()
        ce, margin = forward(cfg, P, tokens)
        if margin >= min_margin:
            ce.backward()
            return P, tokens, ce, margin, seed
    raise RuntimeError(f"no seed gives {what} ≥ {min_margin}")


def write_stacked_case(out, case, script, cfg, P, ns, tokens, ce, margin, seed, dtype):
    """Write a case of a script that models its own architecture (gptoss.py, llama4.py): config, weights in
    dtype, tokens, float32 gradients and expected.json, with no auxiliary loss. ns lists (name, _, _) per tensor."""
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "config.json"),
               dict(cfg, _source=f"moescope torchref test model '{case}' (testdata/torchref/{script}), not a published checkpoint"))
    write_safetensors(os.path.join(out, "model.safetensors"), [(n, P[n], dtype) for n, _, _ in ns])
    write_json(os.path.join(out, "tokens.json"), tokens.tolist())
    write_safetensors(os.path.join(out, "grads.safetensors"), [(n, P[n].grad, "F32") for n, _, _ in ns])
    write_json(os.path.join(out, "expected.json"), {
        "loss": ce.item(), "aux_loss": 0.0, "total_loss": ce.item(), "aux_added": False, "aux_coef": 0.0,
        "routing_margin": margin, "seed": seed, "weights_dtype": dtype, "torch_version": torch.__version__})


def build(name, cfg, out):
    hf = {k: v for k, v in cfg.items() if not k.startswith("_")}
    a = Arch(hf)
    dtype, shards, seq, batch = cfg["_dtype"], cfg.get("_shards", 1), cfg.get("_seq", SEQ), cfg.get("_batch", BATCH)
    for seed in range(1000, 1100):
        P = init_params(a, seed, dtype)
        g = torch.Generator().manual_seed(seed + 7)
        tokens = torch.randint(0, a.V, (batch, seq), generator=g)
        for v in P.values():
            v.requires_grad_(True)
        ce, aux, total, margin = forward(a, P, tokens)
        if margin >= MIN_MARGIN:
            break
    else:
        raise RuntimeError(f"{name}: no seed gives routing margins ≥ {MIN_MARGIN}")
    total.backward()
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    write_json(os.path.join(d, "config.json"), dict(hf, _source=f"moescope torchref test model '{name}' (testdata/torchref/torchref.py), not a published checkpoint"))
    names = a.names()
    items = [(n, P[n], "F32" if kind == "buffer" else dtype) for n, _, kind in names]
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), items)
    else:
        per = (len(items) + shards - 1) // shards
        weight_map, total_size = {}, 0
        for s in range(shards):
            fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = items[s * per:(s + 1) * per]
            write_safetensors(os.path.join(d, fn), part)
            for n, t, dt in part:
                weight_map[n] = fn
                total_size += len(tensor_bytes(t, dt))
        write_json(os.path.join(d, "model.safetensors.index.json"),
                   {"metadata": {"total_size": total_size}, "weight_map": weight_map})
    write_json(os.path.join(d, "tokens.json"), tokens.tolist())
    grads = [(n, P[n].grad if P[n].grad is not None and kind != "buffer" else torch.zeros(shape), "F32")
             for n, shape, kind in names]
    write_safetensors(os.path.join(d, "grads.safetensors"), grads)
    expected = {
        "loss": ce.item(), "aux_loss": aux.item(), "total_loss": total.item(),
        "aux_added": a.aux_on, "aux_coef": a.aux_coef if a.aux_on else 0.0,
        "routing_margin": margin, "seed": seed, "weights_dtype": dtype,
        "torch_version": torch.__version__,
    }
    if a.aux_on:
        # torchtitan's convention (inputs tokens[:, :-1]) changes the aux loss: write it too.
        for v in P.values():
            v.grad = None
        ce2, aux2, total2, margin2 = forward(a, P, tokens, shifted=True)
        total2.backward()
        expected["shifted"] = {"loss": ce2.item(), "aux_loss": aux2.item(), "total_loss": total2.item(), "routing_margin": margin2}
        write_safetensors(os.path.join(d, "grads_shifted.safetensors"),
                          [(n, P[n].grad if kind != "buffer" else torch.zeros(shape), "F32") for n, shape, kind in names])
    write_json(os.path.join(d, "expected.json"), expected)
    gmax = max(float(t.abs().max()) for _, t, _ in grads)
    print(f"{name:8s} {a.type:10s} seed {seed} loss {ce.item():.6f} aux {aux.item():.6f} total {total.item():.6f} "
          f"margin {margin:.4f} max|grad| {gmax:.4g}")


def main():
    """torchref.py [OUT [CASE ...]]: every case, or the named ones, into OUT (default: beside this file)."""
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    names = sys.argv[2:] or list(CONFIGS)
    for name in names:
        build(name, CONFIGS[name], out)


if __name__ == "__main__":
    main()
