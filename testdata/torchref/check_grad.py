#!/usr/bin/python3
"""Compare a gradient file written by `moescope grad` with a reference written by torchref.py.

    /usr/bin/python3 testdata/torchref/check_grad.py G.safetensors testdata/torchref/NAME/grads.safetensors

Reads both files with its own safetensors parser (so it also checks that moescope's writer produces
files an independent reader accepts) and prints, per tensor and overall, max|g − ref| / max|ref|.
Exit status 1 when any tensor exceeds 1e-4 or the names differ.
"""
import json
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base, out = 8 + n, {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        raw = bytearray(data[base + b:base + end])
        t = torch.frombuffer(raw, dtype=DTYPES[e["dtype"]]) if raw else torch.zeros(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).to(torch.float64)
    return out


def main():
    got, ref = read(sys.argv[1]), read(sys.argv[2])
    if set(got) != set(ref):
        print("names differ:", sorted(set(got) ^ set(ref)))
        sys.exit(1)
    worst, worst_name = 0.0, ""
    for name in ref:
        m = ref[name].abs().max().item() if ref[name].numel() else 0.0
        d = (got[name] - ref[name]).abs().max().item() if ref[name].numel() else 0.0
        q = d / m if m > 0 else (0.0 if d == 0 else float("inf"))
        if q >= worst:
            worst, worst_name = q, name
    print(f"{len(ref)} tensors; worst max|g - ref| / max|ref| = {worst:.3e} ({worst_name})")
    sys.exit(0 if worst <= 1e-4 else 1)


if __name__ == "__main__":
    main()
