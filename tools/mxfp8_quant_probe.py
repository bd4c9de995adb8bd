"""MXFP8 quantize kernel on the GPU: GB/s per block shape against a device copy, and the launch knobs' A/B in one
call (bench/NOTES.md "MXFP8 v4"). `python tools/mxfp8_quant_probe.py` prints a short table last.

Shapes: the bench's broadcast-Q K/V (T_kv = 566k rows, 4 heads, D128; V in (32, 1) blocks over 512 sequences) and
its dense batch (32768 rows, 16 heads). Bytes counted as the bench does: 2 read + 1 written per element + 1 per 32.
Each row sets ``configs.KNOBS.mxfp8_quant_pipelined`` and ``mxfp8_quantize.QUANT_WARPS`` / ``QUANT_STAGES`` (read at
launch) and checks the result bit-exact against the first row's (v3's geometry, the default).
"""
from __future__ import annotations

import importlib

import torch
import triton

from jfa_ops.backends.triton.configs import KNOBS

mq = importlib.import_module("jfa_ops.backends.triton.mxfp8_quantize")

CONFIGS = [  # (name, KNOBS.mxfp8_quant_pipelined, warps per 128 columns, stages)
    ("v3 geometry", False, dict(mq.QUANT_WARPS), mq.QUANT_STAGES),
    ("pipelined", True, dict(mq.QUANT_WARPS), mq.QUANT_STAGES),
    ("pipe cols2", True, {"rows": 4, "cols": 2}, 3),
    ("pipe 2 stages", True, dict(mq.QUANT_WARPS), 2),
]


def main() -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    lens = torch.randint(64, 2150, (512,), generator=g, device=dev)
    cases = [("bcast K/V T566k H4", int(lens.sum()), 4, lens), ("dense T32768 H16", 32768, 16, None)]
    copy_src = torch.empty(1 << 29, dtype=torch.uint8, device=dev)
    copy_dst = torch.empty_like(copy_src)
    copy_ms = triton.testing.do_bench(lambda: copy_dst.copy_(copy_src), warmup=50, rep=300, return_mode="median")
    copy_gbps = 2 * copy_src.numel() / copy_ms / 1e6
    print(f"device copy: {copy_gbps:.0f} GB/s (read + write)")
    rows = []
    default = (KNOBS.mxfp8_quant_pipelined, dict(mq.QUANT_WARPS), mq.QUANT_STAGES)
    for case, total, heads, seq_lens in cases:
        x = torch.randn(total, heads, 128, device=dev, generator=g, dtype=torch.bfloat16)
        offsets = None
        if seq_lens is not None:
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), seq_lens.cumsum(0)])
        moved = x.numel() * 3 + x.numel() // 32
        for block in ((1, 32), (32, 1), (32, 32)):
            offs = offsets if block[0] > 1 else None
            want = None
            for name, pipelined, warps, stages in CONFIGS:
                KNOBS.mxfp8_quant_pipelined, mq.QUANT_WARPS, mq.QUANT_STAGES = pipelined, warps, stages
                data, scale = mq.quantize(x, offs, block, "rceil")
                if want is None:
                    want = (data.view(torch.uint8).clone(), scale.view(torch.uint8).clone())
                same = torch.equal(data.view(torch.uint8), want[0]) and torch.equal(scale.view(torch.uint8), want[1])
                ms = triton.testing.do_bench(lambda: mq.quantize(x, offs, block, "rceil"), warmup=25, rep=200,
                                             return_mode="median")
                gbps = moved / ms / 1e6
                rows.append((case, f"{block[0]}x{block[1]}", name, ms * 1e3, gbps, gbps / copy_gbps, same))
            KNOBS.mxfp8_quant_pipelined, mq.QUANT_WARPS, mq.QUANT_STAGES = default
    print(f"{'case':20} {'block':6} {'config':12} {'us':>8} {'GB/s':>7} {'of copy':>7} same")
    for case, block, name, us, gbps, share, same in rows:
        print(f"{case:20} {block:6} {name:12} {us:8.1f} {gbps:7.0f} {share:7.0%} {same}")


if __name__ == "__main__":
    main()
