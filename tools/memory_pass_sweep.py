"""TIMING ONLY, GPU: the backward's two memory-bound passes (the delta pre-pass, which also zeroes the fp32 dQ
accumulator, and the dQ finalize) alone, at the sparse bench's size (T66944, H16, D128, bf16), over their launch
sizes: `python3 tools/memory_pass_sweep.py` (stock Triton or 3.8 + TLX). Prints per config the median time and the
bandwidth over the bytes each pass must move (delta: O + dO read, dQ fp32 zeroed; finalize: dQ fp32 read, bf16
written), against the shipped sizes (DELTA_BLOCK_T, FINALIZE_BLOCK with 4 warps). Why: an H100 profile read the
finalize at ~72% of HBM peak and the delta at ~85% (bench/NOTES.md "Stop 54"), ~0.72 ms of the block-sparse
causal keep 0.25 backward's 4.79."""
from __future__ import annotations

import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jfa_ops.backends.triton import attn_bwd  # noqa: E402
from jfa_ops.backends.triton.common import head_dim_consts, row_strides  # noqa: E402


def ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def main() -> int:
    total, heads, dim = int(os.environ.get("SWEEP_T", 66944)), 16, 128
    dev = "cuda"
    out = torch.randn(total, heads, dim, device=dev, dtype=torch.bfloat16)
    grad_out = torch.randn_like(out)
    delta = torch.empty(heads, total, device=dev, dtype=torch.float32)
    dq_acc = torch.randn(total, heads, dim, device=dev, dtype=torch.float32)
    dq = torch.empty_like(out)
    n = out.numel()
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}, T{total} H{heads} D{dim}")
    print(f"shipped: DELTA_BLOCK_T {attn_bwd.DELTA_BLOCK_T}, FINALIZE_BLOCK {attn_bwd.FINALIZE_BLOCK}, 4 warps")
    delta_bytes = n * (2 + 2 + 4)
    for block_t in (32, 64, 128):
        for warps in (4, 8):
            def run(block_t=block_t, warps=warps):
                attn_bwd.attn_bwd_delta_kernel[(triton.cdiv(total, block_t), heads)](
                    out, grad_out, delta, delta, dq_acc, total, total, **row_strides("o", out),
                    **row_strides("do", grad_out), **head_dim_consts(dim), BLOCK_T=block_t, HAS_GRAD_LSE=False,
                    ZERO=True, num_warps=warps)
            t = ms(run)
            print(f"delta    BLOCK_T {block_t:5d} warps {warps}: {t * 1e3:8.1f} us, {delta_bytes / t / 1e9:6.2f} TB/s")
    fin_bytes = n * (4 + 2)
    for block in (1024, 2048, 4096, 8192):
        for warps in (4, 8):
            def run(block=block, warps=warps):
                attn_bwd.attn_bwd_dq_finalize_kernel[(triton.cdiv(n, block),)](
                    dq_acc, dq, n, 1, 0, 0.088, BLOCK=block, num_warps=warps)
            t = ms(run)
            print(f"finalize BLOCK {block:7d} warps {warps}: {t * 1e3:8.1f} us, {fin_bytes / t / 1e9:6.2f} TB/s")
    copy_bytes = n * 4 * 2
    src = dq_acc.view(-1)
    dst = torch.empty_like(src)
    t = ms(lambda: dst.copy_(src))
    print(f"torch fp32 copy (reference bandwidth): {t * 1e3:8.1f} us, {copy_bytes / t / 1e9:6.2f} TB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
