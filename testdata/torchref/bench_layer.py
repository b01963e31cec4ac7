#!/usr/bin/env python3
"""Time one Qwen3-MoE decoder layer, forward + backward, in PyTorch on the CPU.

The layer is computed the way Hugging Face transformers' Qwen3-MoE modeling
code computes it on a CPU without flash kernels: RMSNorm, q/k/v projections,
per-head RMSNorm of q and k, rotary embedding, eager attention (KV heads
repeated to the query heads, a full score matrix with an additive causal
mask, softmax in float32, then P·V), o_proj and a residual; then RMSNorm, the
router (softmax over experts, top-k, optional renormalization) and the
sparse-MoE block's loop over the experts that received tokens, each a SwiGLU
MLP on its gathered rows, scattered back with index_add_; a second residual.
Backward is autograd on sum(out * dy).

It is the PyTorch side of `moescope bench --torch testdata/torchref/bench_layer.py`,
which passes the same shapes and thread count and prints both speeds and
their ratio. Standalone:

    /usr/bin/python3 testdata/torchref/bench_layer.py --tokens 2048 --threads 2

prints a table line and, with --json, a final JSON line with tokens_per_s.
"""
import argparse
import json
import math
import os
import sys
import time

# torch is imported in main() after the BLAS thread count is set.
torch = F = None


def rms_norm(x, w, eps):
    # HF Qwen3MoeRMSNorm: variance in float32, x * rsqrt(mean(x^2) + eps) * w.
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_tables(seq, dim, theta):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class Layer:
    def __init__(self, a, gen):
        D, H, G, d, E, Fx = a.hidden, a.heads, a.kv_heads, a.head_dim, a.experts, a.expert_ffn

        def w(*shape):
            return (torch.randn(*shape, generator=gen) * 0.02).requires_grad_()

        self.a = a
        self.ln1 = torch.ones(D, requires_grad=True)
        self.ln2 = torch.ones(D, requires_grad=True)
        self.wq, self.wk, self.wv, self.wo = w(H * d, D), w(G * d, D), w(G * d, D), w(D, H * d)
        self.qn = torch.ones(d, requires_grad=True)
        self.kn = torch.ones(d, requires_grad=True)
        self.router = w(E, D)
        self.gate = [w(Fx, D) for _ in range(E)]
        self.up = [w(Fx, D) for _ in range(E)]
        self.down = [w(D, Fx) for _ in range(E)]
        self.cos, self.sin = rope_tables(a.tokens, d, a.rope_theta)
        s = a.tokens
        i = torch.arange(s)
        allowed = i[None, :] <= i[:, None]
        if a.window > 0:
            allowed &= i[None, :] > i[:, None] - a.window
        # HF's eager path adds a float mask holding the dtype's minimum.
        self.mask = torch.zeros(s, s).masked_fill(~allowed, torch.finfo(torch.float32).min)

    def forward(self, x):
        a = self.a
        B, S, D = x.shape
        H, G, d = a.heads, a.kv_heads, a.head_dim
        h = rms_norm(x, self.ln1, a.eps)
        q = F.linear(h, self.wq).view(B, S, H, d)
        k = F.linear(h, self.wk).view(B, S, G, d)
        v = F.linear(h, self.wv).view(B, S, G, d)
        if a.qk_norm:
            q, k = rms_norm(q, self.qn, a.eps), rms_norm(k, self.kn, a.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * self.cos + rotate_half(q) * self.sin
        k = k * self.cos + rotate_half(k) * self.sin
        rep = H // G
        k = k[:, :, None].expand(B, G, rep, S, d).reshape(B, H, S, d)  # repeat_kv
        v = v[:, :, None].expand(B, G, rep, S, d).reshape(B, H, S, d)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d) + self.mask
        w = F.softmax(w, dim=-1, dtype=torch.float32)
        o = torch.matmul(w, v).transpose(1, 2).reshape(B, S, H * d)
        x = x + F.linear(o, self.wo)

        h = rms_norm(x, self.ln2, a.eps).view(-1, D)
        logits = F.linear(h, self.router)
        probs = F.softmax(logits, dim=1, dtype=torch.float32)
        rw, sel = torch.topk(probs, a.top_k, dim=-1)
        if a.norm_topk:
            rw = rw / rw.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(h)
        hit = F.one_hot(sel, num_classes=a.experts).permute(2, 1, 0)  # [E, K, T]
        for e in range(a.experts):
            slot, tok = torch.where(hit[e])
            if tok.numel() == 0:
                continue
            xe = h[tok]
            ye = F.linear(F.silu(F.linear(xe, self.gate[e])) * F.linear(xe, self.up[e]), self.down[e])
            out.index_add_(0, tok, ye * rw[tok, slot, None])
        return x + out.view(B, S, D)


def blas_library():
    """The BLAS shared library torch's process loaded (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "blas" in line.lower()}
        return ", ".join(sorted(os.path.basename(x) for x in libs)) or "unknown"
    except OSError:
        return "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--expert-ffn", type=int, default=768)
    p.add_argument("--window", type=int, default=0)
    p.add_argument("--rope-theta", type=float, default=1e6)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--qk-norm", action="store_true", default=False)
    p.add_argument("--norm-topk", action="store_true", default=False)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    # OpenBLAS (Debian's libopenblas0, which torch reaches through libblas.so.3)
    # keeps its own thread pool: give it the same count as torch's OpenMP.
    os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    global torch, F
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(0)
    layer = Layer(a, gen)
    x = torch.randn(1, a.tokens, a.hidden, generator=gen).requires_grad_()
    dy = torch.randn(1, a.tokens, a.hidden, generator=gen) * 1e-3
    times, cpu = [], []
    for i in range(a.iters + 1):  # the first run warms up
        t0, c0 = time.perf_counter(), time.process_time()
        y = layer.forward(x)
        y.backward(dy)
        t, c = time.perf_counter() - t0, time.process_time() - c0
        if i > 0:
            times.append(t)
            cpu.append(c)
    best = min(times)
    res = {"version": torch.__version__, "blas": blas_library(), "threads": torch.get_num_threads(), "seconds": best,
           "tokens_per_s": a.tokens / best, "all_seconds": times,
           # Process CPU time of each run (all threads; OpenMP and OpenBLAS
           # threads that spin while waiting count too).
           "cpu_seconds": cpu}
    print(f"pytorch {torch.__version__} ({res['blas']}), {res['threads']} threads: forward+backward {best:.3f} s, "
          f"{res['tokens_per_s']:.0f} tokens/s", file=sys.stderr if a.json else sys.stdout)
    if a.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
