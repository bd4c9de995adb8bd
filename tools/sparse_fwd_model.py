"""CPU model of the TLX block-sparse forward's schedule on the bench's quick sparse batch (bench/NOTES.md "TLX sparse
forward vs FA4, helper sparsefwd, stop 26"): per work item (128-row query tile, head) the selected 128-key blocks it
walks, how many of them run the masked softmax (the item's first, and the causal diagonal), the busiest program
over the mean under each work order, and with ``--l2`` a coarse L2 model (``fwd_schedule_model.l2_model``'s: LRU
over 64 KiB K+V blocks of (sequence, kv head, key block), programs one block per step).

Orders: ``default`` (what ``attn_fwd.block_sparse_forward`` launches: the list sorted by selected blocks,
``configs.fwd_choices``' kv-major static striding unmasked, tile-major masked), ``alt order`` (the other striding:
tools/tlx_check.py sparse-timing's column), ``zigzag (Gn)`` (``configs.SPARSE_FORWARD_ZIGZAG``: the dense forward's
``configs.FORWARD_ZIGZAG`` order with ``configs.fwd_head_group``'s group, by the snake), ``fa4`` (FA4's sm_90
varlen grid as the hardware hands it out: one CTA per (m block, head), sequences in the batch's order, within one
head-major (unmasked) or FA4's LPT L2 sections (causal: ``nheads_in_l2`` heads, last m block first), each CTA to
the first SM free).

The selection is a random top-k of the op's budget (``ceil(keep x visible)`` with the local block first), which is
how the bench's random inputs select (``sparse_bwd_model``'s rule). ``python tools/sparse_fwd_model.py [--l2]``.
"""
from __future__ import annotations

import heapq
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fwd_schedule_model as fsm  # noqa: E402
from bench.suites import sparse_cases  # noqa: E402

SMS, BLOCK = fsm.SMS, 128
# An item's fixed cost in blocks for the balance model (the H200 fits put it at ~2 blocks for this kernel: bench/
# NOTES.md "TLX sparse forward vs FA4"); balance only, the L2 model steps one block per PER_ITEM between items.
PER_ITEM = 2.0


def selection(lens, heads, keep, causal, seed=0):
    """Per sequence, head and Q block: the ascending selected key blocks (the local block, then a random rest of
    ``ceil(keep x visible) - 1``)."""
    rng = np.random.default_rng(seed)
    out = []
    for length in lens:
        nb = length // BLOCK
        per_head = []
        for _ in range(heads):
            rows = []
            for i in range(nb):
                vis = i + 1 if causal else nb
                k = math.ceil(keep * vis) - 1
                others = [b for b in range(vis) if b != i]
                rows.append(sorted([i] + (list(rng.choice(others, k, replace=False)) if k > 0 else [])))
            per_head.append(rows)
        out.append(per_head)
    return out


def tile_list(sel):
    """(seq, q block) sorted as ``block_sparse_fwd.selected_cost`` sorts the list: selected blocks summed over the
    heads, descending, ties in (seq, block) order."""
    tiles = [(sum(len(h[i]) for h in per_head), s, i) for s, per_head in enumerate(sel) for i in range(len(per_head[0]))]
    tiles.sort(key=lambda t: -t[0])
    return [(s, i) for _, s, i in tiles]


def masked_blocks(walk, i, causal):
    """Blocks of an item's walk that take the masked softmax: its first (peeled, always masked) and, causal, the
    diagonal block i when it is not the first (``_consume_tile_one_loop``'s masked branch)."""
    return min(len(walk), 1 + (causal and len(walk) > 1 and walk[-1] == i))


def orders(sel, heads, causal):
    """Name -> each program's items (seq, kv head, q block, walk)."""
    tiles = tile_list(sel)
    n = len(tiles)
    lens = [len(p[0]) * BLOCK for p in sel]
    kv_major = fsm.CONFIGS.fwd_choices(fsm.CONFIGS.fwd_config(128), causal, False, False)[1]
    group = fsm.CONFIGS.fwd_head_group(heads, 1, fsm.capacity(lens), SMS, False)

    def item(t, h):
        s, i = tiles[t]
        return s, h, i, sel[s][h][i]

    def strided(mapping, snake):
        out = [[] for _ in range(SMS)]
        for w in range(n * heads):
            out[fsm.snake(w)[0] if snake else w % SMS].append(item(*mapping(w)))
        return out

    plans = {"default": strided(lambda w: fsm.work_item(w, n, heads, 1, kv_major), False),
             "alt order": strided(lambda w: fsm.work_item(w, n, heads, 1, not kv_major), False),
             f"zigzag (G{group})": strided(lambda w: fsm.zigzag_item(w, n, heads, 1, group), True)}
    for g in (1, 4):
        if g != group:
            plans[f"zigzag G{g}"] = strided(lambda w, g=g: fsm.zigzag_item(w, n, heads, 1, g), True)
    plans["fa4"] = greedy(fa4_order(sel, heads, causal))
    return plans


def fa4_order(sel, heads, causal):
    """FA4 b36's ``VarlenDecoder.decode`` order of the grid (sequences as given; unmasked: head-major within one;
    causal (lpt): sections of nheads_in_l2 heads (50 MB of 64 KiB K+V blocks), block-major within a section, the
    last m block first)."""
    out = []
    max_blocks = 50 * 1024 * 1024 // (2 * 128 * 2 * 128)
    for s, per_head in enumerate(sel):
        nb = len(per_head[0])
        if not causal:
            out += [(s, h, i, per_head[h][i]) for h in range(heads) for i in range(nb)]
            continue
        in_l2 = min(next((g for g in (16, 8, 4, 2) if nb * g <= max_blocks), 1), heads)
        for h0 in range(0, heads, in_l2):
            hs = range(h0, min(h0 + in_l2, heads))
            out += [(s, h, i, per_head[h][i]) for i in reversed(range(nb)) for h in hs]
    return out


def greedy(items):
    """Each item to the first program free (its cost: blocks + PER_ITEM), in list order."""
    heap = [(0.0, p) for p in range(SMS)]
    out = [[] for _ in range(SMS)]
    for it in items:
        t, p = heapq.heappop(heap)
        out[p].append(it)
        heapq.heappush(heap, (t + len(it[3]) + PER_ITEM, p))
    return out


def busiest(programs):
    """(busiest program's cost over the mean, its cost in blocks): blocks + PER_ITEM per item."""
    loads = np.array([sum(len(w) + PER_ITEM for *_, w in mine) for mine in programs])
    return loads.max() / loads.mean(), loads.max()


def l2_model(programs, l2_mib=40):
    """DRAM KiB per key block: ``fwd_schedule_model.l2_model``'s LRU over 64 KiB K+V blocks (seq, kv head, block),
    each item visiting its selected blocks, PER_ITEM steps between items."""
    return fsm.l2_model(programs, l2_mib, blocks_of=lambda item: [(item[0], item[1], b) for b in item[3]],
                        per_item=PER_ITEM)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    l2 = "--l2" in argv
    for case in sparse_cases([128], "quick"):
        lens, heads = case.kv_lens, case.num_heads_kv
        sel = selection(lens, heads, case.keep_ratio, case.causal)
        walks = [(s, i, w) for s, per_head in enumerate(sel) for rows in per_head for i, w in enumerate(rows)]
        n = np.array([len(w) for *_, w in walks])
        masked = sum(masked_blocks(w, i, case.causal) for _, i, w in walks)
        diagonal = sum(case.causal and len(w) > 1 and w[-1] == i for _, i, w in walks)
        print(f"{case.name}: items {len(walks)} ({len(walks) / SMS:.1f} per SM), blocks {n.sum()} "
              f"({n.sum() / SMS:.0f} per SM), per item mean {n.mean():.1f} median {np.median(n):.0f}, items of "
              f"<= 2 / <= 4 blocks {np.mean(n <= 2):.0%} / {np.mean(n <= 4):.0%}; masked softmax {masked} blocks "
              f"({masked / n.sum():.1%}: first {len(walks) - (n == 0).sum()}, diagonal past the first {diagonal})",
              flush=True)
        fsm.print_orders(orders(sel, heads, case.causal), l2, busiest, l2_model, unit="blocks + items")
    return 0


if __name__ == "__main__":
    sys.exit(main())
