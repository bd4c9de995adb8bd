"""CPU model of the TLX dense backward's schedule on the bench's dense rows, causal against full (bench/NOTES.md "TLX
backward: causal (helper tlxbwdcausal)"): per work item (key tile of 128 keys, kv head) the 64-row query blocks it
walks, the busiest program over the mean under static striding for each work order the kernel can take, the masked
blocks and the per-item share, and a coarse L2 model (``sparse_bwd_model.l2_model``: LRU over 32 KiB records of
Q+dO and fp32 dQ, 50 MB) of the DRAM bytes per block and the distinct (head, query block) rows the items in flight
walk.

Orders (``orders``): the default (tile-major over the key tile list sorted longest first: a causal batch of equal
lengths is sorted tile index first, so the 16 heads of one tile of each of the 8 sequences run side by side, 128
streams of Q/dO/dQ rows with one item each), kv heads in groups of G (``configs.BACKWARD_HEAD_GROUP``, the kernel's
HEAD_GROUPED mapping; G=1 is kv-head-major), ``configs.BACKWARD_ITEM_ORDER``'s snake, and
``configs.BACKWARD_CAUSAL_ORDER``'s per-item list (``block_sparse_bwd.causal_item_list``).
``python tools/bwd_causal_model.py [--l2]`` (--l2: ~1 min per case).
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jfa_ops.backends.triton.block_sparse_bwd import stream_section  # noqa: E402
from tools.sparse_bwd_model import PER_ITEM, SMS, imbalance, l2_model, lpt, per_program  # noqa: E402

BLOCK_N, BLOCK_M = 128, 64  # keys per item, query rows per block (configs.bwd_config_v2(128))
# (name, batch, seq len, kv heads): the bench's dense D128 backward rows (bench/suites.py dense_cases)
CASES = (("B8 S8192", 8, 8192, 16), ("B8 S2048", 8, 2048, 16))


def tile_list(batch, seqlen, causal):
    """(seq, key tile index, blocks walked) as ``scheduling.kv_tiles`` sorts them (cost = keys x visible rows,
    descending, stable over (seq, start)), padding left out (the kernel skips it)."""
    n = seqlen // BLOCK_N
    tiles = [(s, j, (seqlen - BLOCK_N * j) // BLOCK_M if causal else seqlen // BLOCK_M)
             for s in range(batch) for j in range(n)]
    return sorted(tiles, key=lambda t: -t[2])


def walk(seq, j, head, seqlen, causal):
    """The (head, global query block) pairs item (seq's key tile j, head) walks, in the kernel's order."""
    first = 2 * j if causal else 0
    base = seq * (seqlen // BLOCK_M)
    return [(head, base + q) for q in range(first, seqlen // BLOCK_M)]


def grouped(n_tiles, heads, group):
    """``common.work_item`` with KV_MAJOR (HEAD_GROUPED): work w -> (tile, head)."""
    out = []
    for w in range(n_tiles * heads):
        g, rest = w % group, w // group
        out.append((rest % n_tiles, (rest // n_tiles) * group + g))
    return out


def causal_order(tiles, heads, section):
    """``block_sparse_bwd.causal_item_list``'s order (the kernel takes it with SNAKE), from the code itself."""
    import torch

    from jfa_ops.backends.triton.block_sparse_bwd import causal_item_list

    seq = torch.tensor([t[0] for t in tiles], dtype=torch.int32)
    start = torch.tensor([t[1] * BLOCK_N for t in tiles], dtype=torch.int32)
    s, st, h = causal_item_list(dict(TILE_SEQ=seq, TILE_START=start), heads, max(t[0] for t in tiles) + 1, section)
    index = {(t[0], t[1]): i for i, t in enumerate(tiles)}
    return [(index[(a, b // BLOCK_N)], c) for a, b, c in zip(s.tolist(), st.tolist(), h.tolist())]


def orders(tiles, heads, sections=()):
    """Name -> each program's items as (tile, head), static striding (snake where the kernel's SNAKE is on)."""
    n = len(tiles)
    tile_major = [(t, h) for t in range(n) for h in range(heads)]
    plans = {"tile-major (default)": per_program(tile_major, False),
             "item order (snake)": per_program(tile_major, True)}
    for g in (1, 2, 4):
        plans[f"hg{g}"] = per_program(grouped(n, heads, g), False)
    for section in sections:
        plans[f"causal order s{section}"] = per_program(causal_order(tiles, heads, section), True)
    return plans


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with_l2, explore = "--l2" in argv, "--sections" in argv
    for name, batch, seqlen, heads in CASES:
        for causal in (False, True):
            tiles = tile_list(batch, seqlen, causal)
            costs = [t[2] for t in tiles for _ in range(heads)]
            blocks = sum(costs)
            masked = 2 * len(costs) if causal else 0
            print(f"{name} H{heads} {'causal' if causal else 'full'}: items {len(costs)} ({len(costs) / SMS:.1f} per "
                  f"SM), blocks {blocks} ({blocks / SMS:.0f} per SM, mean {np.mean(costs):.1f} per item), masked "
                  f"{masked} ({masked / blocks:.1%}), per-item share {PER_ITEM * len(costs) / blocks:.1%}, LPT "
                  f"{lpt([c + PER_ITEM for c in costs]):.4f}", flush=True)
            chosen = stream_section(seqlen, 1, 128, 40 << 20)  # tlx configs.CAUSAL_ORDER_L2_BYTES
            sections = sorted({chosen, 1, 2, 4, 8, 16} if explore else {chosen})
            for order, mine in orders(tiles, heads, sections).items():
                walks = [[walk(*tiles[t][:2], h, seqlen, causal) for t, h in items] for items in mine]
                line = f"    {order:22s} busiest SM {imbalance(walks):.4f}"
                if with_l2:
                    kib, mib, hs = l2_model(walks)
                    line += f"; DRAM {kib:.1f} KiB/block; in flight: {mib:.0f} MiB of rows, {hs:.1f} heads"
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
