#!/usr/bin/python3
"""Writes testdata/mxfp4/: a one-layer GPT-OSS checkpoint whose experts are MXFP4, as the released
GPT-OSS checkpoints store them (gate_up_proj_blocks [E, 2F, D/32, 16] and gate_up_proj_scales
[E, 2F, D/32], down_proj_blocks [E, D, F/32, 16] and down_proj_scales [E, D, F/32], all U8; the
layout transformers' integrations/mxfp4.py reads at 0189b1d0), every other tensor F32.

    /usr/bin/python3 testdata/mxfp4/mxfp4.py      (standard library only)

The packed bytes follow fixed formulas (below) so that a test can work out expected dequantized values
by hand from the OCP MX v1.0 specification: block byte (e, r, g, j) = (97·e + 7·r + 13·j + 5) mod 256,
scale (e, r, g) = 125 + (e + r) mod 5 (2^-2 … 2^2, never the NaN 0xFF). The F32 tensors hold
(i mod 7 − 3)/8 for their i-th element, norms 1.
"""
import json
import os
import struct

CONFIG = {
    "model_type": "gpt_oss", "vocab_size": 8, "hidden_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 32,
    "num_local_experts": 2, "num_experts_per_tok": 1, "tie_word_embeddings": False,
    "_source": "moescope MXFP4 test model (testdata/mxfp4/mxfp4.py), not a published checkpoint",
}


def f32(shape, norm=False):
    n = 1
    for s in shape:
        n *= s
    vals = [1.0] * n if norm else [((i % 7) - 3) / 8 for i in range(n)]
    return "F32", shape, struct.pack(f"<{n}f", *vals)


def packed(E, R, C):
    G = C // 32
    blocks = bytes((97 * e + 7 * r + 13 * j + 5) % 256 for e in range(E) for r in range(R) for g in range(G) for j in range(16))
    scales = bytes(125 + (e + r) % 5 for e in range(E) for r in range(R) for g in range(G))
    return ("U8", [E, R, G, 16], blocks), ("U8", [E, R, G], scales)


def tensors():
    c = CONFIG
    D, F, E, H, d, V = c["hidden_size"], c["intermediate_size"], c["num_local_experts"], 1, c["head_dim"], c["vocab_size"]
    a, m = "model.layers.0.self_attn.", "model.layers.0.mlp."
    out = {"model.embed_tokens.weight": f32([V, D]), "model.layers.0.input_layernorm.weight": f32([D], True)}
    for p, rows, cols in (("q", H * d, D), ("k", d, D), ("v", d, D), ("o", D, H * d)):
        out[a + p + "_proj.weight"], out[a + p + "_proj.bias"] = f32([rows, cols]), f32([rows])
    out[a + "sinks"] = f32([H])
    out["model.layers.0.post_attention_layernorm.weight"] = f32([D], True)
    out[m + "router.weight"], out[m + "router.bias"] = f32([E, D]), f32([E])
    out[m + "experts.gate_up_proj_blocks"], out[m + "experts.gate_up_proj_scales"] = packed(E, 2 * F, D)
    out[m + "experts.gate_up_proj_bias"] = f32([E, 2 * F])
    out[m + "experts.down_proj_blocks"], out[m + "experts.down_proj_scales"] = packed(E, D, F)
    out[m + "experts.down_proj_bias"] = f32([E, D])
    out["model.norm.weight"], out["lm_head.weight"] = f32([D], True), f32([V, D])
    return out


def main():
    d = os.path.dirname(os.path.abspath(__file__))
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dtype, shape, b) in sorted(tensors().items()):
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
