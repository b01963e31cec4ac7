#!/usr/bin/python3
"""Independent PyTorch reference for GPT-OSS (model_type gpt_oss), case testdata/torchref/gpt_oss.

Written from transformers' modeling_gpt_oss.py at commit 00d4b3d2142cb4ced2f51b90614b5d26bc045015
(GptOssAttention with eager_attention_forward, GptOssTopKRouter, GptOssExperts' training branch,
GptOssDecoderLayer) as read in 2026; our own code, float64 autograd from the stored weights. The files
written are those of torchref.py (whose writers, RMSNorm and YaRN frequencies it reuses):

    /usr/bin/python3 testdata/torchref/gptoss.py [OUTDIR]    (default: beside this file)

The case: 2 layers (layer_types sliding_attention with sliding_window 3, then full_attention) over
sequences of 10; 4 query heads on 2 KV heads of 4 dims; q, k, v and o biases; one sink logit per head;
YaRN (factor 4 over an original context of 16, rope_theta 100, truncate false); 4 experts of width 6,
top-2 of the biased router's logits softmaxed; the experts stacked as GptOssExperts stores them
(gate_up_proj [E, D, 2F] with gate and up interleaved) with biases, under the clamped SwiGLU
(alpha 1.702 and limit 7, fixed in GptOssExperts at that commit). The gate_up weights are drawn large
enough that about one activation in ten passes the limit, so the clamps and their zero gradients are
exercised; margins keep float32 on the same side of every clamp and routing decision. The aux loss is
off (output_router_logits false, GptOssConfig's default).
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchref as tr  # noqa: E402  (writers, rmsnorm, inv_freq)

CONFIG = {
    "model_type": "gpt_oss", "vocab_size": 24, "hidden_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4, "intermediate_size": 6,
    "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 3,
    "layer_types": ["sliding_attention", "full_attention"], "attention_bias": True,
    "rms_norm_eps": 1e-5, "rope_theta": 100.0, "max_position_embeddings": 64,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                     "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
    "initializer_range": 0.02, "tie_word_embeddings": False, "output_router_logits": False,
    "router_aux_loss_coef": 0.9, "hidden_act": "silu",
}
ALPHA, LIMIT = 1.702, 7.0  # GptOssExperts.__init__ at 00d4b3d2
BATCH, SEQ, DTYPE = 2, 10, "BF16"
MIN_MARGIN = 1e-3
CLAMPED = [0, 0]  # activations past the limit, of all, in the last forward


def names(c):
    """(name, shape, kind) of every checkpoint tensor, as GptOss* modules declare them."""
    D, H, G, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, F, V = c["num_local_experts"], c["intermediate_size"], c["vocab_size"]
    out = [("model.embed_tokens.weight", (V, D), "embed")]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        out.append((p + "input_layernorm.weight", (D,), "norm"))
        for proj, rows, cols in (("q", H * d, D), ("k", G * d, D), ("v", G * d, D), ("o", D, H * d)):
            out += [(a + proj + "_proj.weight", (rows, cols), "weight"), (a + proj + "_proj.bias", (rows,), "bias")]
        out.append((a + "sinks", (H,), "sink"))
        out.append((p + "post_attention_layernorm.weight", (D,), "norm"))
        m = p + "mlp."
        out += [(m + "router.weight", (E, D), "weight"), (m + "router.bias", (E,), "bias"),
                (m + "experts.gate_up_proj", (E, D, 2 * F), "gate_up"), (m + "experts.gate_up_proj_bias", (E, 2 * F), "bias"),
                (m + "experts.down_proj", (E, F, D), "down"), (m + "experts.down_proj_bias", (E, D), "bias")]
    out += [("model.norm.weight", (D,), "norm"), ("lm_head.weight", (V, D), "weight")]
    return out


def init_params(c, seed):
    g = torch.Generator().manual_seed(seed)
    P = {}
    for name, shape, kind in names(c):
        r = torch.randn(shape, generator=g)
        scale = {"norm": 0.2, "bias": 0.1, "sink": 0.5, "embed": 1.0, "gate_up": 1.5}.get(kind, 1.2 / math.sqrt(shape[-1]))
        P[name] = tr.round_to((1.0 if kind == "norm" else 0.0) + scale * r, DTYPE)
    return P


def apply_rotary(x, cos, sin):
    """_apply_rotary_emb: the two halves of the head rotated by cos and sin of width d/2."""
    first, second = torch.chunk(x, 2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def attention(c, P, a, x, window):
    """GptOssAttention.forward with eager_attention_forward: biased projections, RoPE, scores
    scaled by head_dim^-0.5 plus the causal (sliding) mask, the head's sink logit appended to every
    row, softmax, the sink's column dropped, times v, o_proj with its bias."""
    B, S, _ = x.shape
    H, G, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    q = (x @ P[a + "q_proj.weight"].T + P[a + "q_proj.bias"]).view(B, S, H, d).transpose(1, 2)
    k = (x @ P[a + "k_proj.weight"].T + P[a + "k_proj.bias"]).view(B, S, G, d).transpose(1, 2)
    v = (x @ P[a + "v_proj.weight"].T + P[a + "v_proj.bias"]).view(B, S, G, d).transpose(1, 2)
    inv, af = tr.inv_freq(d, c["rope_theta"], c["rope_scaling"])
    freqs = torch.outer(torch.arange(S, dtype=torch.float64), inv)
    cos, sin = freqs.cos() * af, freqs.sin() * af
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)  # repeat_kv
    w = (q @ k.transpose(2, 3)) * d ** -0.5
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    allowed = j <= i
    if window:
        allowed = allowed & (j > i - window)  # create_sliding_window_causal_mask: i − window < j ≤ i
    w = w + torch.zeros(S, S).masked_fill(~allowed, float("-inf"))
    sinks = P[a + "sinks"].reshape(1, -1, 1, 1).expand(B, -1, S, -1)
    logits = torch.cat([w, sinks], dim=-1)
    logits = logits - logits.max(dim=-1, keepdim=True).values
    probs = torch.softmax(logits, dim=-1)[..., :-1]
    o = (probs @ v).transpose(1, 2).reshape(B, S, H * d)
    return o @ P[a + "o_proj.weight"].T + P[a + "o_proj.bias"]


def mlp(c, P, m, x):
    """GptOssMLP: GptOssTopKRouter (top-k of the biased logits, softmax over those k) and
    GptOssExperts' training loop (stacked weights, gate/up interleaved, clamped SwiGLU, biases,
    output times the routing weight, index_add). Returns the output and the smallest margin of a
    routing decision or a clamp."""
    B, S, D = x.shape
    E, K = c["num_local_experts"], c["num_experts_per_tok"]
    h = x.reshape(-1, D)
    logits = h @ P[m + "router.weight"].T + P[m + "router.bias"]
    top, idx = torch.topk(logits, K, dim=-1)
    top = torch.softmax(top, dim=1)
    scores = torch.zeros_like(logits).scatter(1, idx, top)
    srt = torch.sort(logits.detach(), dim=-1, descending=True)[0]
    margin = (srt[:, K - 1] - srt[:, K]).min().item()
    out = torch.zeros_like(h)
    for e in range(E):
        tok = torch.where((idx == e).any(dim=-1))[0]
        if tok.numel() == 0:
            continue
        gate_up = h[tok] @ P[m + "experts.gate_up_proj"][e] + P[m + "experts.gate_up_proj_bias"][e]
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        margin = min(margin, (gate.detach() - LIMIT).abs().min().item(), ((up.detach().abs() - LIMIT).abs().min().item()))
        CLAMPED[0] += int((gate.detach() > LIMIT).sum() + (up.detach().abs() > LIMIT).sum())
        CLAMPED[1] += 2 * gate.numel()
        gate = gate.clamp(min=None, max=LIMIT)
        up = up.clamp(min=-LIMIT, max=LIMIT)
        glu = gate * torch.sigmoid(gate * ALPHA)
        y = ((up + 1) * glu) @ P[m + "experts.down_proj"][e] + P[m + "experts.down_proj_bias"][e]
        out = out.index_add(0, tok, y * scores[tok, e, None])
    return out.view(B, S, D), margin


def forward(c, P, tokens):
    """HF's convention as torchref.py: every token an input, labels the next tokens (-100 last)."""
    pad = torch.full((tokens.shape[0], 1), -100, dtype=tokens.dtype)
    labels = torch.cat((tokens[:, 1:], pad), dim=1)
    x = P["model.embed_tokens.weight"][tokens]
    eps, margin = c["rms_norm_eps"], 1.0
    for l, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{l}."
        window = c["sliding_window"] if kind == "sliding_attention" else 0
        x = x + attention(c, P, p + "self_attn.", tr.rmsnorm(x, P[p + "input_layernorm.weight"], eps), window)
        y, m = mlp(c, P, p + "mlp.", tr.rmsnorm(x, P[p + "post_attention_layernorm.weight"], eps))
        x, margin = x + y, min(margin, m)
    x = tr.rmsnorm(x, P["model.norm.weight"], eps)
    logits = x @ P["lm_head.weight"].T
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    return ce, margin


def reset_clamped():
    CLAMPED[:] = [0, 0]


def main():
    out = os.path.join(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)), "gpt_oss")
    P, tokens, ce, margin, seed = tr.seeded_case(CONFIG, init_params, forward, BATCH, SEQ, MIN_MARGIN, "margins", reset=reset_clamped)
    ns = names(CONFIG)
    tr.write_stacked_case(out, "gpt_oss", "gptoss.py", CONFIG, P, ns, tokens, ce, margin, seed, DTYPE)
    print(f"gpt_oss seed {seed} loss {ce.item():.6f} margin {margin:.4f} "
          f"clamped {CLAMPED[0]} of {CLAMPED[1]} activations max|grad| {max(float(P[n].grad.abs().max()) for n, _, _ in ns):.4g}")


if __name__ == "__main__":
    main()
