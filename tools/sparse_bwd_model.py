"""CPU model of the TLX block-sparse backward's schedule on the bench's quick sparse batch (bench/NOTES.md "TLX
block-sparse backward v2"): per work item (key tile, kv head) the 64-row query tiles it walks, the static-stride
imbalance of the work order (tile-major today, ``configs.BACKWARD_ITEM_ORDER``'s snake over a per-item list, an
LPT bound), and a coarse L2 model (LRU, each block touching 32 KiB of Q+dO and 32 KiB of fp32 dQ) per order
(tile-major, kv heads in groups of G: ``configs.BACKWARD_HEAD_GROUP``).

The selection is a random top-k of the op's budget (``ceil(keep x visible)`` with the local block first), which is
how the bench's random inputs select. ``python tools/sparse_bwd_model.py [--l2]`` (the L2 model takes ~1 min).
"""
from __future__ import annotations

import heapq
import math
import os
import sys
from collections import OrderedDict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.suites import sparse_cases  # noqa: E402

SMS, BLOCK, TILE = 132, 128, 64  # programs (H200 SMs), selection block, backward query tile
PER_ITEM = 1.5  # an item's fixed cost in blocks (K/V load, epilogue, walk: ~3-4 us against ~2.7 us per block)


def items(lens, heads, keep, causal, seed=0):
    """Tile-major work list as the kernel runs it: for each key tile (sorted longest first by blocks summed over
    heads, stable), its heads; each item the list of (head, query tile) it walks."""
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0], np.cumsum(lens)]) // TILE
    tiles = []
    for s, length in enumerate(lens):
        nb = length // BLOCK
        chosen = [[[] for _ in range(nb)] for _ in range(heads)]  # head, kv block -> q blocks
        for h in range(heads):
            for i in range(nb):
                vis = i + 1 if causal else nb
                others = [b for b in range(vis) if b != i]
                k = math.ceil(keep * vis) - 1
                for b in [i] + (list(rng.choice(others, k, replace=False)) if k > 0 else []):
                    chosen[h][b].append(i)
        for j in range(nb):
            walks = [[(h, starts[s] + 2 * b + t) for b in sorted(chosen[h][j]) for t in (0, 1)] for h in range(heads)]
            tiles.append((sum(len(w) for w in walks) if keep < 1 else (nb - j if causal else nb), walks))
    tiles.sort(key=lambda t: -t[0])
    return [t[1] for t in tiles]


def order(tiles, group=0):
    """Items in the kernel's order: tile-major (group 0), or kv heads in groups of ``group`` (``work_item``)."""
    n, heads = len(tiles), len(tiles[0])
    if group in (0, heads):
        return [tiles[t][h] for t in range(n) for h in range(heads)]
    out = []
    for w in range(n * heads):
        g, rest = w % group, w // group
        out.append(tiles[rest % n][(rest // n) * group + g])
    return out


def imbalance(costs, snake=False):
    """The busiest program's cost over the mean for static striding (snake: every other round reversed)."""
    prog = np.zeros(SMS)
    for w, c in enumerate(costs):
        r, col = divmod(w, SMS)
        prog[(SMS - 1 - col) if snake and r % 2 else col] += c
    return prog.max() / prog.mean()


def lpt(costs):
    heap = [(0.0, p) for p in range(SMS)]
    for c in sorted(costs, reverse=True):
        t, p = heapq.heappop(heap)
        heapq.heappush(heap, (t + c, p))
    return max(t for t, _ in heap) / (sum(costs) / SMS)


def dram_kib_per_block(work, l2_mb=50):
    """LRU over 32 KiB records; programs advance one block per step (PER_ITEM steps between items); a Q+dO miss
    reads 32 KiB, a dQ miss reads and later writes 32 KiB."""
    cache, cap, misses, blocks = OrderedDict(), l2_mb * 1024 // 32, [0, 0], 0
    mine = [work[p::SMS] for p in range(SMS)]
    heap = [(0.0, p, 0, 0) for p in range(SMS)]
    while heap:
        clock, p, i, t = heapq.heappop(heap)
        if i >= len(mine[p]):
            continue
        walk = mine[p][i]
        if t >= len(walk):
            heapq.heappush(heap, (clock + PER_ITEM, p, i + 1, 0))
            continue
        for kind in (0, 1):
            key = (kind,) + walk[t]
            if key in cache:
                cache.move_to_end(key)
            else:
                misses[kind] += 1
                cache[key] = 1
                if len(cache) > cap:
                    cache.popitem(last=False)
        blocks += 1
        heapq.heappush(heap, (clock + 1.0, p, i, t + 1))
    return (32 * misses[0] + 64 * misses[1]) / blocks


def main(argv=None) -> int:
    l2 = "--l2" in (sys.argv[1:] if argv is None else argv)
    case = sparse_cases([128], "quick")[0]
    lens, heads = case.kv_lens, case.num_heads_kv
    print(f"T{sum(lens)}, {len(lens)} sequences, H{heads}; items (key tile, kv head), blocks = 64-row query tiles")
    for keep, causal in ((1.0, False), (0.5, False), (0.25, False), (1.0, True), (0.5, True), (0.25, True)):
        tiles = items(lens, heads, keep, causal)
        work = order(tiles)
        n = np.array([len(w) for w in work])
        costs = list(n + PER_ITEM)
        line = (f"keep {keep} {'causal' if causal else 'full  '}: items {len(work)} blocks {n.sum()} mean "
                f"{n.mean():.1f} median {np.median(n):.0f} p90 {np.percentile(n, 90):.0f} max {n.max()}; busiest SM "
                f"over mean: tile-major {imbalance(costs):.4f}, item order (sorted, snake) "
                f"{imbalance(sorted(costs, reverse=True), True):.4f}, LPT {lpt(costs):.4f}")
        if l2:
            line += "; DRAM KiB/block " + ", ".join(
                f"G{g or heads} {dram_kib_per_block(order(tiles, g)):.1f}" for g in (0, 4, 2))
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
