#!/usr/bin/python3
"""Independent PyTorch reference for Llama 4's text decoder (model_type llama4_text), case testdata/torchref/llama4.

Written from transformers' modeling_llama4.py at commit 000c33fdfde12e1ffafbfcdb3c926df5727a00b6
(Llama4TextAttention, Llama4TextL2Norm, Llama4Router, Llama4TextMoe, Llama4TextExperts, Llama4TextMLP,
Llama4TextDecoderLayer; the chunked mask as create_chunked_causal_mask builds it: query i sees keys j <= i of its
own chunk) as read in 2026; our own code, float64 autograd from the stored weights. The files written are those
of torchref.py (whose writers, RMSNorm and complex RoPE it reuses):

    /usr/bin/python3 testdata/torchref/llama4.py [OUTDIR]    (default: beside this file)

The case: 3 layers over sequences of 10. no_rope_layers [1, 0, 1]: layers 0 and 2 rotate (adjacent pairs as
complex numbers), normalize q and k per head by their RMS without weight after RoPE (use_qk_norm) and attend
within chunks of 4 (positions 0-3, 4-7, 8-9: chunk < sequence); layer 1 is a NoPE layer with full causal
attention whose queries are scaled by 1 + 0.5*ln(1 + floor((p+1)/3)) (attn_temperature_tuning with floor_scale 3,
attn_scale 0.5: factor 1 at positions 0-1, then 1.35, 1.55, 1.69). interleave_moe_layer_step 2 makes layer 1 the
MoE layer (4 experts of width 6, top-1, the sigmoid of the chosen logit scaling the expert's input row, the
experts stacked as gate_up_proj [E, D, 2F] split in halves, one shared expert of width 6 beside them); layers 0
and 2 are dense MLPs of intermediate_size_mlp 10. Llama4ForCausalLM adds no router loss.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchref as tr  # noqa: E402  (writers, rmsnorm, rope_complex, round_to)

CONFIG = {
    "model_type": "llama4_text", "vocab_size": 24, "hidden_size": 16, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4, "intermediate_size": 6,
    "intermediate_size_mlp": 10, "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
    "no_rope_layers": [1, 0, 1], "attention_chunk_size": 4, "use_qk_norm": True, "attn_temperature_tuning": True,
    "floor_scale": 3, "attn_scale": 0.5, "rms_norm_eps": 1e-5, "rope_theta": 100.0, "attention_bias": False,
    "tie_word_embeddings": False, "initializer_range": 0.02, "hidden_act": "silu", "max_position_embeddings": 64,
}
BATCH, SEQ, DTYPE = 2, 10, "BF16"
MIN_MARGIN = 1e-3


def moe_layers(c):
    """Every interleave_moe_layer_step-th layer, counting from step - 1."""
    step = c["interleave_moe_layer_step"]
    return set(range(step - 1, c["num_hidden_layers"], step))


def names(c):
    """(name, shape, kind) of every checkpoint tensor, as the Llama4Text* modules declare them."""
    D, H, G, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, F, Fd, V = c["num_local_experts"], c["intermediate_size"], c["intermediate_size_mlp"], c["vocab_size"]
    out = [("model.embed_tokens.weight", (V, D), "embed")]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        out.append((p + "input_layernorm.weight", (D,), "norm"))
        out += [(a + "q_proj.weight", (H * d, D), "weight"), (a + "k_proj.weight", (G * d, D), "weight"),
                (a + "v_proj.weight", (G * d, D), "weight"), (a + "o_proj.weight", (D, H * d), "weight")]
        out.append((p + "post_attention_layernorm.weight", (D,), "norm"))
        f = p + "feed_forward."
        if l in moe_layers(c):
            out += [(f + "router.weight", (E, D), "weight"),
                    (f + "experts.gate_up_proj", (E, D, 2 * F), "stacked"), (f + "experts.down_proj", (E, F, D), "stacked")]
            f += "shared_expert."
            Fd = F
        out += [(f + "gate_proj.weight", (Fd, D), "weight"), (f + "up_proj.weight", (Fd, D), "weight"),
                (f + "down_proj.weight", (D, Fd), "weight")]
        Fd = c["intermediate_size_mlp"]
    out += [("model.norm.weight", (D,), "norm"), ("lm_head.weight", (V, D), "weight")]
    return out


def init_params(c, seed):
    g = torch.Generator().manual_seed(seed)
    P = {}
    for name, shape, kind in names(c):
        r = torch.randn(shape, generator=g)
        if kind == "norm":
            v = 1.0 + 0.2 * r
        elif kind == "embed":
            v = r
        else:  # stacked tensors are input-major: their fan-in is the second dim
            v = r * 1.2 / math.sqrt(shape[-2] if kind == "stacked" else shape[-1])
        P[name] = tr.round_to(v, DTYPE)
    return P


def l2norm(x, eps):
    """Llama4TextL2Norm: x / sqrt(mean(x^2) + eps) over the head dim, no weight."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def attention(c, P, a, x, rope_layer):
    B, S, _ = x.shape
    H, G, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    q = (x @ P[a + "q_proj.weight"].T).view(B, S, H, d).transpose(1, 2)
    k = (x @ P[a + "k_proj.weight"].T).view(B, S, G, d).transpose(1, 2)
    v = (x @ P[a + "v_proj.weight"].T).view(B, S, G, d).transpose(1, 2)
    pos = torch.arange(S, dtype=torch.float64)
    if rope_layer:
        q, k = tr.rope_complex(q, c["rope_theta"]), tr.rope_complex(k, c["rope_theta"])
        if c["use_qk_norm"]:
            q, k = l2norm(q, c["rms_norm_eps"]), l2norm(k, c["rms_norm_eps"])
    elif c["attn_temperature_tuning"]:
        scale = 1.0 + c["attn_scale"] * torch.log1p(torch.floor((pos + 1.0) / c["floor_scale"]))
        q = q * scale.view(1, 1, S, 1)
    k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
    s = (q @ k.transpose(2, 3)) * d ** -0.5
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    seen = j <= i
    if rope_layer:  # layer_types' default: the RoPE layers are the chunked ones
        C = c["attention_chunk_size"]
        seen = seen & (torch.div(j, C, rounding_mode="floor") == torch.div(i, C, rounding_mode="floor"))
    o = torch.softmax(s.masked_fill(~seen, float("-inf")), dim=-1) @ v
    return o.transpose(1, 2).reshape(B, S, H * d) @ P[a + "o_proj.weight"].T


def swiglu(P, f, x):
    return (torch.nn.functional.silu(x @ P[f + "gate_proj.weight"].T) * (x @ P[f + "up_proj.weight"].T)) @ P[f + "down_proj.weight"].T


def moe(c, P, f, x):
    """Llama4TextMoe: the router's top-k logits through a sigmoid (the others score 0) scale each expert's
    input row; every expert runs on every row (a zero row gives zero); the shared expert adds its output.
    Returns the output and the smallest gap between the k-th and the next logit."""
    B, S, D = x.shape
    E, F, K = c["num_local_experts"], c["intermediate_size"], c["num_experts_per_tok"]
    h = x.reshape(-1, D)
    logits = h @ P[f + "router.weight"].T
    top, idx = torch.topk(logits, K, dim=-1)
    scores = torch.zeros_like(logits).scatter(1, idx, torch.sigmoid(top))
    srt = torch.sort(logits.detach(), dim=-1, descending=True)[0]
    margin = (srt[:, K - 1] - srt[:, K]).min().item()
    out = swiglu(P, f + "shared_expert.", h)
    for e in range(E):
        gu = (h * scores[:, e:e + 1]) @ P[f + "experts.gate_up_proj"][e]
        gate, up = gu[:, :F], gu[:, F:]
        out = out + (up * torch.nn.functional.silu(gate)) @ P[f + "experts.down_proj"][e]
    return out.view(B, S, D), margin


def forward(c, P, tokens):
    """HF's convention as torchref.py: every token an input, labels the next tokens (-100 last)."""
    pad = torch.full((tokens.shape[0], 1), -100, dtype=tokens.dtype)
    labels = torch.cat((tokens[:, 1:], pad), dim=1)
    x = P["model.embed_tokens.weight"][tokens]
    eps, margin = c["rms_norm_eps"], 1.0
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        x = x + attention(c, P, p + "self_attn.", tr.rmsnorm(x, P[p + "input_layernorm.weight"], eps), c["no_rope_layers"][l] == 1)
        h = tr.rmsnorm(x, P[p + "post_attention_layernorm.weight"], eps)
        if l in moe_layers(c):
            y, m = moe(c, P, p + "feed_forward.", h)
            margin = min(margin, m)
        else:
            y = swiglu(P, p + "feed_forward.", h)
        x = x + y
    x = tr.rmsnorm(x, P["model.norm.weight"], eps)
    logits = x @ P["lm_head.weight"].T
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    return ce, margin


def main():
    out = os.path.join(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)), "llama4")
    P, tokens, ce, margin, seed = tr.seeded_case(CONFIG, init_params, forward, BATCH, SEQ, MIN_MARGIN, "a routing margin")
    ns = names(CONFIG)
    tr.write_stacked_case(out, "llama4", "llama4.py", CONFIG, P, ns, tokens, ce, margin, seed, DTYPE)
    print(f"llama4 seed {seed} loss {ce.item():.6f} margin {margin:.4f} "
          f"max|grad| {max(float(P[n].grad.abs().max()) for n, _, _ in ns):.4g}")


if __name__ == "__main__":
    main()
