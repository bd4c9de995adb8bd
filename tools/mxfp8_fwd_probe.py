"""MXFP8 forward variants on the GPU, pre-quantized inputs (the kernel alone), beside our bf16 kernel in the same
process: TFLOP/s and the output's difference from the default variant (bench/NOTES.md "MXFP8 v4").
`python tools/mxfp8_fwd_probe.py [variant ...]` (default: bf16smem f16row) prints a short table last.

Cases: the bench's dense B8 S4096 H16 D128 (compute-bound) and broadcast-Q Lq128 H4 over 512 sequences.
"""
from __future__ import annotations

import sys

import torch
import triton

import jfa_ops
from jfa_ops.backends.triton.configs import KNOBS


def _case(name, dev, g):
    if name == "dense B8 S4096":
        lens = torch.full((8,), 4096, device=dev)
        heads, q_lens, bcast = 16, lens, False
    else:
        lens = torch.randint(64, 2150, (512,), generator=g, device=dev)
        heads, q_lens, bcast = 4, torch.full((1,), 128, device=dev), True
    kv_off = torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), lens.cumsum(0)])
    q_off = None if bcast else kv_off
    rows_q = int(q_lens.sum())
    q = torch.randn(rows_q, heads, 128, device=dev, generator=g, dtype=torch.bfloat16)
    k = torch.randn(int(lens.sum()), heads, 128, device=dev, generator=g, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    pairs_per_q = (128 * lens).sum() if bcast else (lens * lens).sum()
    flops = 4.0 * float(pairs_per_q) * heads * 128
    max_q = 128 if bcast else 4096
    return q, k, v, q_off, kv_off, bcast, flops, max_q, int(lens.max())


def main(variants) -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for name in ("dense B8 S4096", "bcast Lq128 H4 B512"):
        q, k, v, q_off, kv_off, bcast, flops, max_q, max_kv = _case(name, dev, g)
        pairs = (jfa_ops.mxfp8_quantize(q), jfa_ops.mxfp8_quantize(k), jfa_ops.mxfp8_quantize(v, kv_off, block=(32, 1)))
        kw = dict(broadcast_q=bcast, backend="triton")

        def bf16():
            return jfa_ops.jagged_attention(q, k, v, q_off, kv_off, max_q, max_kv, **kw)

        ms = triton.testing.do_bench(bf16, warmup=25, rep=200, return_mode="median")
        rows.append((name, "our bf16", flops / ms / 1e9, None))
        first = None
        for variant in variants:
            KNOBS.mxfp8_variant = variant

            def fwd():
                return jfa_ops.mxfp8_attention(*pairs, q_off, kv_off, max_q, max_kv, out_dtype=torch.float32, **kw)

            try:
                out = fwd()
                first = out if first is None else first
                diff = float((out - first).norm() / first.norm())
                ms = triton.testing.do_bench(fwd, warmup=25, rep=200, return_mode="median")
                rows.append((name, variant, flops / ms / 1e9, diff))
            except Exception as e:  # a variant refused on CUDA or failing to compile: its row says so
                rows.append((name, f"{variant}: {type(e).__name__}", float("nan"), None))
    print(f"{'case':22} {'kernel':22} {'TFLOP/s':>8} {'vs bf16':>7} {'rel diff':>9}")
    base = {}
    for name, kernel, tf, diff in rows:
        base.setdefault(name, tf)
        d = "" if diff is None else f"{diff:9.1e}"
        print(f"{name:22} {kernel:22} {tf:8.1f} {tf / base[name]:7.2f} {d}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["bf16smem", "f16row"])
