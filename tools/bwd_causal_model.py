"""CPU model of the TLX dense backward's schedule on the bench's dense and jagged D128 rows, causal against full
(bench/NOTES.md "TLX backward: causal (helper tlxbwdcausal)"): per work item (key tile of 128 keys, kv head) the 64-row query blocks it
walks, the busiest program over the mean under static striding for each work order the kernel can take, the masked
blocks and the per-item share, and a coarse L2 model (``sparse_bwd_model.l2_model``: LRU over 32 KiB records of
Q+dO and fp32 dQ, 50 MB) of the DRAM bytes per block and the distinct (head, query block) rows the items in flight
walk.

Orders (``orders``): the default (tile-major over the key tile list sorted longest first: a causal batch of equal
lengths is sorted tile index first, so the 16 heads of one tile of each of the 8 sequences run side by side, 128
streams of Q/dO/dQ rows with one item each), kv heads in groups of G (``configs.BACKWARD_HEAD_GROUP``, the kernel's
HEAD_GROUPED mapping; G=1 is kv-head-major), ``configs.BACKWARD_ITEM_ORDER``'s snake, and
``configs.BACKWARD_CAUSAL_ORDER``'s per-item list (``block_sparse_bwd.causal_item_list``).
``python tools/bwd_causal_model.py [--l2] [--sections]`` (--l2: ~5 min in all; --sections: the causal order with
L2 budgets of 10-80 MiB).
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools.sparse_bwd_model import PER_ITEM, SMS, imbalance, l2_model, lpt, per_program  # noqa: E402

BLOCK_N, BLOCK_M = 128, 64  # keys per item, query rows per block (configs.bwd_config_v2(128))


def cases():
    """(name, lengths, kv heads): the bench's dense and jagged D128 backward rows (bench/suites.py, quick)."""
    from bench.suites import JAGGED_SEED, lognormal_lengths

    jagged = [lognormal_lengths(t, None, seed=JAGGED_SEED) for t in (8 * 2048, 8 * 8192)]
    return ([("B8 S8192", (8192,) * 8, 16), ("B8 S2048", (2048,) * 8, 16)]
            + [(f"jagged T{sum(x)} n{len(x)}", x, 16) for x in jagged])


def tile_list(lens, causal):
    """(seq, key tile index, length, blocks walked) as ``scheduling.kv_tiles`` sorts them (cost = keys x visible
    rows, descending, stable over (seq, start)), padding left out (the kernel skips it)."""
    tiles = []
    for s, n in enumerate(lens):
        for j in range(-(-n // BLOCK_N)):
            rows = min(BLOCK_N, n - BLOCK_N * j)
            visible = n - BLOCK_N * j if causal else n
            tiles.append((rows * visible, s, j, n, -(-n // BLOCK_M) - (2 * j if causal else 0)))
    return [t[1:] for t in sorted(tiles, key=lambda t: -t[0])]


def walk(seq, j, length, head, causal):
    """The (head, (seq, query block)) pairs item (seq's key tile j, head) walks, in the kernel's order."""
    return [(head, (seq, q)) for q in range(2 * j if causal else 0, -(-length // BLOCK_M))]


def grouped(n_tiles, heads, group):
    """``common.work_item`` with KV_MAJOR (HEAD_GROUPED): work w -> (tile, head)."""
    out = []
    for w in range(n_tiles * heads):
        g, rest = w % group, w // group
        out.append((rest % n_tiles, (rest // n_tiles) * group + g))
    return out


def causal_order(tiles, heads, lens, l2_bytes):
    """``block_sparse_bwd.causal_item_list``'s order (the kernel takes it with SNAKE), from the code itself."""
    import torch

    from jfa_ops.backends.triton.block_sparse_bwd import causal_item_list

    seq = torch.tensor([t[0] for t in tiles], dtype=torch.int32)
    start = torch.tensor([t[1] * BLOCK_N for t in tiles], dtype=torch.int32)
    offsets = torch.tensor([0] + list(lens)).cumsum(0).to(torch.int32)
    s, st, h = causal_item_list(dict(TILE_SEQ=seq, TILE_START=start), heads, offsets, 128 * 8, l2_bytes)
    index = {(t[0], t[1]): i for i, t in enumerate(tiles)}
    return [(index[(a, b // BLOCK_N)], c) for a, b, c in zip(s.tolist(), st.tolist(), h.tolist())]


def orders(tiles, heads, lens, budgets=()):
    """Name -> each program's items as (tile, head), static striding (snake where the kernel's SNAKE is on)."""
    n = len(tiles)
    tile_major = [(t, h) for t in range(n) for h in range(heads)]
    plans = {"tile-major (default)": per_program(tile_major, False),
             "item order (snake)": per_program(tile_major, True)}
    for g in (1, 2, 4):
        plans[f"hg{g}"] = per_program(grouped(n, heads, g), False)
    for mib in budgets:
        plans[f"causal order {mib} MiB"] = per_program(causal_order(tiles, heads, lens, mib << 20), True)
    return plans


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with_l2, explore = "--l2" in argv, "--sections" in argv
    for name, lens, heads in cases():
        for causal in (False, True):
            tiles = tile_list(lens, causal)
            costs = [t[3] for t in tiles for _ in range(heads)]
            blocks = sum(costs)
            masked = 2 * len(costs) if causal else 0
            print(f"{name} H{heads} {'causal' if causal else 'full'}: items {len(costs)} ({len(costs) / SMS:.1f} per "
                  f"SM), blocks {blocks} ({blocks / SMS:.0f} per SM, mean {np.mean(costs):.1f} per item), masked "
                  f"{masked} ({masked / blocks:.1%}), per-item share {PER_ITEM * len(costs) / blocks:.1%}, LPT "
                  f"{lpt([c + PER_ITEM for c in costs]):.4f}", flush=True)
            budgets = (10, 20, 40, 80) if explore else (40,)  # MiB; 40: configs.CAUSAL_ORDER_L2_BYTES
            for order, mine in orders(tiles, heads, lens, budgets).items():
                walks = [[walk(*tiles[t][:3], h, causal) for t, h in items] for items in mine]
                line = f"    {order:22s} busiest SM {imbalance(walks):.4f}"
                if with_l2:
                    kib, mib, hs = l2_model(walks)
                    line += f"; DRAM {kib:.1f} KiB/block; in flight: {mib:.0f} MiB of rows, {hs:.1f} heads"
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
