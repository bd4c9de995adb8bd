"""CPU model of the TLX dense backward's schedule on GQA (helper gqabwd, bench/NOTES.md "TLX GQA backward balance"):
the bench's "GQA 16:2, jagged T=32768, causal" row against the MHA jagged causal rows.

A work item is (key tile of 128 keys, kv head) and walks, for every q head of the kv head's group, the 64-row query
blocks its keys see (``attn_bwd``: ``for g in range(g_begin, g_end)``), so GQA has group-times fewer, longer items.
Per item: blocks = heads x visible query blocks (causal: ceil(L / 64) - 2 j for key tile j), the two diagonal blocks
per head at ``MASKED_COST``, plus ``PER_ITEM`` blocks of fixed cost (K/V load, epilogue). The list is
``scheduling.kv_tiles``' (longest first, stable; ``bwd_causal_model.tile_list``), the items tile-major (the kernel's
``work_item``: tile = w // units, unit = w % units; with GROUP_SPLIT a unit is kv head x part), taken by static
striding (program p: p, p + 132, ...) or the snake (ITEM_ORDER). Reported: items per SM, the longest item, the mean
per SM, the busiest program (the makespan in block units) over the mean, LPT's bound, and a TFLOP/s prediction
calibrated on the MHA T32768 causal row of the same batch (tlx_check backward-timing, H200: 417.5 TF/s). ``--l2``
adds ``sparse_bwd_model.l2_model``'s DRAM KiB per block (LRU over 32 KiB Q+dO / fp32 dQ records, 50 MB; ~1-2 min per
order). ``python tools/gqa_bwd_model.py [--l2]`` (~2 s; --l2 ~1 min; with TLX on the path, e.g.
``PYTHONPATH=/work/venv-tlx/lib/python3.11/site-packages:.``, it also prints ``configs.gqa_split_parts``' choice).
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools.bwd_causal_model import FIXED_S_PER_ROW_D128, MASKED_COST, tile_list  # noqa: E402
from tools.sparse_bwd_model import PER_ITEM, SMS, l2_model, lpt, per_program  # noqa: E402

HEAD_DIM, BLOCK_M, BLOCK_N = 128, 64, 128
SPLIT_ITEM = 0.5  # a split item's extra fixed cost in blocks: 2 x 64 fp32 red per thread + the dK/dV re-read
CALIBRATION = ("MHA 16:16 T32768", 417.5)  # tlx_check backward-timing default, H200 2026-12-02 (bench/NOTES.md v16)
MEASURED = {"GQA 16:2 T32768": 310.2, "MHA 16:16 T16384": 423.4, "MHA 16:16 T65536": 350.4,
            "MHA 16:16 T32768": 417.5}  # bench 2026-12-02 17:43 (T32768 MHA: tlx_check), default TLX backward


def cases():
    """(name, lengths, q heads, kv heads): the bench's GQA row and MHA jagged causal rows (bench.suites, quick),
    tlx_check's MHA T32768 row (the GQA row's batch) and issue 10's GQA 32:4 on it."""
    from bench.suites import JAGGED_SEED, lognormal_lengths

    lens = {t: lognormal_lengths(t, None, seed=JAGGED_SEED) for t in (16384, 32768, 65536)}
    return [("GQA 16:2 T32768", lens[32768], 16, 2), ("MHA 16:16 T32768", lens[32768], 16, 16),
            ("MHA 16:16 T16384", lens[16384], 16, 16), ("MHA 16:16 T65536", lens[65536], 16, 16),
            ("GQA 32:4 T32768", lens[32768], 32, 4)]


def items(lens, heads_q, heads_kv, parts=1):
    """The kernel's work list: per item (tile index, kv head, first q head, end, cost in blocks), tile-major."""
    group = heads_q // heads_kv
    per = group // parts
    out = []
    for t, (_, _, _, blocks) in enumerate(tile_list(lens, True)):
        for unit in range(heads_kv * parts):
            kv, first = unit // parts, (unit % parts) * per
            cost = per * (blocks + (MASKED_COST - 1) * min(2, blocks)) + PER_ITEM + (SPLIT_ITEM if parts > 1 else 0)
            out.append((t, kv, first, first + per, cost))
    return out


def walks(lens, work, group):
    """Each item's (head, (seq, query block)) walk, in the kernel's order (the L2 model's input)."""
    tiles = tile_list(lens, True)
    out = []
    for t, kv, first, end, _ in work:
        seq, j, length, _ = tiles[t]
        out.append([(kv * group + g, (seq, q)) for g in range(first, end) for q in range(2 * j, -(-length // BLOCK_M))])
    return out


def schedule(work, snake):
    """(busiest program's cost, mean per program) in blocks."""
    load = [sum(w[4] for w in mine) for mine in per_program(work, snake)]
    return max(load), float(np.mean(load))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from jfa_ops.backends.triton.scheduling import capacity_of

    try:  # the rule itself (TLX must import: its package raises without it)
        import _utlx_autoregister  # noqa: F401

        from jfa_ops.backends.tlx.configs import gqa_split_parts
    except ImportError:
        gqa_split_parts = None

    rows = {}
    for name, lens, hq, hkv in cases():
        group = hq // hkv
        slots = capacity_of(sum(lens), BLOCK_N, len(lens))
        rule = gqa_split_parts(group, slots * hkv, SMS, 16) if gqa_split_parts else "(TLX not importable: ?)"
        print(f"{name}: {len(lens)} sequences, longest {max(lens)}; {slots} key tile slots x {hkv} kv heads "
              f"(group {group}); GQA_SPLIT=16 takes {rule} parts", flush=True)
        for parts in [d for d in range(1, group + 1) if group % d == 0]:
            work = items(lens, hq, hkv, parts)
            costs = [w[4] for w in work]
            for snake in (False, True):
                busiest, mean = schedule(work, snake)
                rows[(name, parts, snake)] = busiest
                line = (f"  parts {parts} {'snake ' if snake else 'stride'}: items {len(work)} ({len(work) / SMS:.1f} "
                        f"per SM), longest {max(costs):.0f}, mean/SM {mean:.0f}, busiest {busiest:.0f} "
                        f"({busiest / mean:.3f} of the mean), LPT {lpt(costs):.3f}")
                if "--l2" in argv and parts in (1, rule) and (snake or parts == 1):
                    kib, mib, hs = l2_model([walks(lens, mine, group) for mine in per_program(work, snake)])
                    line += f"; DRAM {kib:.1f} KiB/block, in flight {mib:.0f} MiB of rows, {hs:.1f} heads"
                print(line, flush=True)
    # Prediction: time = busiest x t_block + the delta / finalize passes (+ the split's zero / cast of dK/dV in fp32),
    # t_block from the calibration row (the same batch, MHA), FLOPs from bench.flops
    from bench.flops import attention_flops, visible_pairs

    def seconds(name, lens, hkv, parts, snake, t_block):
        # the split's fp32 dK/dV buffer (2 x T x Hkv x D x 4 B): zeroed, its lines read and written back around the
        # red adds, read and cast (half) after: ~4.5 x its bytes of DRAM at 3.4 TB/s
        extra = 0.0 if parts == 1 else 4.5 * 2 * sum(lens) * hkv * HEAD_DIM * 4 / 3.4e12
        return rows[(name, parts, snake)] * t_block + FIXED_S_PER_ROW_D128 * sum(lens) + extra

    by_name = {c[0]: c for c in cases()}
    cname, ctf = CALIBRATION
    _, clens, chq, _ = by_name[cname]
    cflops = attention_flops(visible_pairs(clens, clens, True), chq, HEAD_DIM, "bwd")
    t_block = (cflops / (ctf * 1e12) - FIXED_S_PER_ROW_D128 * sum(clens)) / rows[(cname, 1, False)]
    print(f"\ncalibration: {cname} at {ctf} TF/s -> {t_block * 1e6:.2f} us per block-unit (busiest program)")
    for name, lens, hq, hkv in cases():
        flops = attention_flops(visible_pairs(lens, lens, True), hq, HEAD_DIM, "bwd")
        group = hq // hkv
        preds = []
        for parts in [d for d in range(1, group + 1) if group % d == 0]:
            for snake in (False, True):
                tf = flops / seconds(name, lens, hkv, parts, snake, t_block) / 1e12
                preds.append(f"{parts}{'s' if snake else ''} {tf:.0f}")
        print(f"{name}: measured {MEASURED.get(name, float('nan'))}; model TF/s by parts (s: snake): "
              + ", ".join(preds), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
