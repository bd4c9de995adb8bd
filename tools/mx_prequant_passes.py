"""The pre-quantized broadcast-Q MXFP8 call's passes, counted (bench/NOTES.md "Issue 12: the pre-quantized
broadcast-Q call's passes, helper mxprep48"). CPU only, no kernel runs: `PYTHONPATH=$PWD python
tools/mx_prequant_passes.py`.

The bench's `mxfp8` row "bcast Lq128 H4 B512" (D128) through `jfa_ops.mxfp8_attention((data, scale) x 3)` on the tlx
backend: per launch of a steady-state call (tile list, broadcast offsets and the offset check are kept across eager
calls) the bytes it reads + writes, from the shapes the code allocates (`mxfp8_rebase.rebase_rows`,
`rebase_v_tiles`, `key_factor_tiles`, the kernel's TMA boxes), and its floor at a measured copy rate. Then the key
blocks the kernel walks and the clk <-> ms rule of `tools/tlx_check.py mxfp8-ablation` (ms x SMs x 1.83 GHz /
blocks), so a pass's time reads as clk per key block beside the kernel's ablation figures.
"""
from __future__ import annotations

import math

COPY_TBS = {"H200": 4.27, "H100": 2.96}  # measured same-bytes copies (bench/NOTES.md stop 44 / stop 47)
SMS = 132
CLOCK_HZ = 1.83e9  # tlx_check.SM_CLOCK_HZ: the convention of every clk figure in NOTES
BLOCK_N = 128  # mxfp8_fwd_config(128).block_n


def case():
    from bench.suites import mxfp8_cases

    return next(c for c in mxfp8_cases((128,), "full") if c.broadcast_q)


def passes(c, factors_tma: bool, tiled_k_factors: bool = False):
    """[(launch, bytes read, bytes written)] of one steady-state pre-quantized call, in launch order.
    ``tiled_k_factors`` (tlx ``configs.MXFP8_TILED_KEY_FACTORS``, with FACTORS_TMA): K's launch writes the factors
    tiled (``rebase_key_tiles``, every tile of the layout) and ``key_factor_tiles`` does not run."""
    rows, heads, dim, seqs, lq = sum(c.kv_lens), c.num_heads_kv, c.head_dim, len(c.kv_lens), c.q_lens[0]
    tiles_layout = rows // BLOCK_N + seqs  # mxfp8_rebase.v_tiles: the padded layout's tiles
    tiles_used = sum(math.ceil(n / BLOCK_N) for n in c.kv_lens)  # the ones a program writes and the kernel reads
    blocks32_used = sum(math.ceil(n / 32) for n in c.kv_lens)
    e4m3 = rows * heads * dim  # one byte an element
    k_scales = rows * heads * (dim // 32)  # (1, 32) E8M0 bytes
    v_scales = blocks32_used * heads * dim  # (32, 1) E8M0 bytes the re-basing reads
    k_factors = rows * heads * 4  # fp32 [Hkv, T]
    vt = tiles_used * BLOCK_N * heads * dim  # V^T, every column of a used tile written (zeros past the end)
    v_factors = tiles_used * heads * dim * 4  # fp32 [tiles, Hkv, D]
    q = lq * c.num_heads_q * dim
    out = seqs * lq * c.num_heads_q * dim * 2 + seqs * lq * c.num_heads_q * 4  # bf16 out + fp32 lse
    k_tiled = tiles_layout * heads * BLOCK_N * 4  # fp32 [tiles, Hkv, 128]
    tiled = factors_tma and tiled_k_factors
    steps = [("rebase_rows(Q)", q + q // 32, q + c.num_heads_q * lq * 4),
             ("rebase_key_tiles(K)" if tiled else "rebase_rows(K)", e4m3 + k_scales,
              e4m3 + (k_tiled if tiled else k_factors)),
             ("rebase_v_tiles(V)", e4m3 + v_scales, vt + v_factors)]
    if factors_tma and not tiled:  # reads the used keys' factors, writes every tile (zeros in padding tiles)
        steps.append(("key_factor_tiles", k_factors, k_tiled))
    steps.append(("mxfp8_attn_fwd_tlx_kernel", q + e4m3 + vt + k_factors + v_factors, out))
    return steps, tiles_used * c.num_heads_q


def ms_to_clk(ms: float, blocks: int) -> float:
    return ms * 1e-3 * SMS * CLOCK_HZ / blocks


def main() -> None:
    c = case()
    print(f"{c.label} D{c.head_dim}: T_kv {sum(c.kv_lens)}, B {len(c.kv_lens)}, H {c.num_heads_kv}")
    for knob, tiled in ((False, False), (True, False), (True, True)):
        steps, blocks = passes(c, knob, tiled)
        print(f"\nMXFP8_FACTORS_TMA={int(knob)}" + (" MXFP8_TILED_KEY_FACTORS=1" if tiled else "")
              + f": {len(steps)} launches a call; the kernel walks {blocks} key blocks "
              f"({blocks / SMS:.1f} an SM); 1 ms = {ms_to_clk(1.0, blocks):.0f} clk a block")
        print(f"  {'launch':28s} {'read MB':>9s} {'written MB':>10s} " + " ".join(
            f"{'floor ' + d + ' us':>15s}" for d in COPY_TBS) + "  clk/block H200 / H100")
        total = {d: 0.0 for d in COPY_TBS}
        for name, read, written in steps:
            us = {d: (read + written) / (tbs * 1e12) * 1e6 for d, tbs in COPY_TBS.items()}
            if name != "mxfp8_attn_fwd_tlx_kernel":
                for d in COPY_TBS:
                    total[d] += us[d]
            print(f"  {name:28s} {read / 1e6:9.1f} {written / 1e6:10.1f} "
                  + " ".join(f"{us[d]:15.1f}" for d in COPY_TBS)
                  + "  " + " / ".join(f"{ms_to_clk(us[d] / 1e3, blocks):.0f}" for d in COPY_TBS))
        print(f"  {'passes before the kernel':28s} {'':9s} {'':10s} " + " ".join(f"{total[d]:15.1f}" for d in COPY_TBS)
              + "  " + " / ".join(f"{ms_to_clk(total[d] / 1e3, blocks):.0f}" for d in COPY_TBS))


if __name__ == "__main__":
    main()
