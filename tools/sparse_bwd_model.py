"""CPU model of the TLX block-sparse backward's schedule on the bench's quick sparse batch (bench/NOTES.md "TLX
block-sparse backward v2" and "ordered head groups"): per work item (key tile, kv head) the 64-row query tiles it
walks, the static-stride imbalance of the work order (tile-major, an LPT bound) and, with ``--schedules``, of each
schedule as the kernel takes it (``orders``: tile-major, kv heads in groups of G (``configs.BACKWARD_HEAD_GROUP``),
``configs.BACKWARD_ITEM_ORDER``'s snake over a per-item list, ``configs.BACKWARD_GROUP_ORDER``'s zigzag over head
groups, and two combinations that lost); ``--l2`` adds a coarse L2 model per schedule (LRU, each block touching
32 KiB of Q+dO and 32 KiB of fp32 dQ) and the rows the items in flight walk.

The selection is a random top-k of the op's budget (``ceil(keep x visible)`` with the local block first), which is
how the bench's random inputs select. ``python tools/sparse_bwd_model.py [--schedules] [--l2]`` (--l2: ~2 min);
``--groups`` (helper sparsehg47; TLX must import, for the tlx configs): the head-group terms (``group_terms``) on a
grid of shapes against ``configs.sparse_auto_head_group``'s choice (~4 min).
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
    """Tile-major work list as the kernel runs it: key tiles sorted longest first by blocks summed over heads
    (stable), each (seq, first key row, per head the list of (head, query tile) it walks)."""
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
            tiles.append((sum(len(w) for w in walks) if keep < 1 else (nb - j if causal else nb), s, j, walks))
    tiles.sort(key=lambda t: -t[0])
    return [t[1:] for t in tiles]


def snake_work(pid, i, programs=SMS):
    """``common.snake_work`` with SNAKE."""
    return i * programs + (pid if i % 2 == 0 else programs - 1 - pid)


def per_program(work, snake):
    """Each program's items in the kernel's order: static striding (pid + i x programs) or the snake."""
    if not snake:
        return [work[p::SMS] for p in range(SMS)]
    return [[work[snake_work(p, i)] for i in range(len(work) // SMS + 1) if snake_work(p, i) < len(work)]
            for p in range(SMS)]


def orders(tiles, group=4):
    """Name -> each program's items (walks), as the kernel takes them under each schedule. The item-list orders are
    built by the code itself (``listed_items``)."""
    n, heads = len(tiles), len(tiles[0][2])
    tile_major = [(t, h) for t in range(n) for h in range(heads)]
    grouped = [(rest % n, (rest // n) * group + w % group) for w, rest in
               ((w, w // group) for w in range(n * heads))]  # common.work_item(KV_MAJOR)
    walk = lambda t, h: tiles[t][2][h]  # noqa: E731
    cost = lambda t, h: len(walk(t, h))  # noqa: E731

    def listed(g):
        return [(t, h) for t, h, _ in listed_items(tiles, g)]

    by_cost = sorted(tile_major, key=lambda th: -cost(*th))  # stable: item_list's order
    first_down = sorted(tile_major, key=lambda th: (th[1] // group, cost(*th) * (1 if th[1] // group % 2 else -1)))
    plans = {"tile-major": per_program(tile_major, False), f"hg{group}": per_program(grouped, False),
             "order": per_program(listed(0), True),
             f"hg{group} sorted": per_program(sorted(tile_major, key=lambda th: (th[1] // group, -cost(*th))), True),
             f"hg{group} zigzag 1st down": per_program(first_down, True),
             f"hg{group} zigzag": per_program(listed(group), True),
             f"hg{group // 2} zigzag": per_program(listed(group // 2), True),
             f"order, by group": [sorted(mine, key=lambda th: th[1] // group) for mine in per_program(by_cost, True)]}
    return {name: [[walk(*th) for th in mine] for mine in plan] for name, plan in plans.items()}


def imbalance(programs):
    """The busiest program's cost (blocks + PER_ITEM per item) over the mean."""
    load = np.array([sum(len(w) + PER_ITEM for w in mine) for mine in programs])
    return load.max() / load.mean()


def imbalance_of(costs, snake=False):
    """``imbalance`` of a list of item costs (blocks + PER_ITEM) under static striding (snake: the snake)."""
    return imbalance(per_program([[None] * int(c - PER_ITEM) for c in costs], snake))


def lpt(costs):
    heap = [(0.0, p) for p in range(SMS)]
    for c in sorted(costs, reverse=True):
        t, p = heapq.heappop(heap)
        heapq.heappush(heap, (t + c, p))
    return max(t for t, _ in heap) / (sum(costs) / SMS)


def l2_model(mine, l2_mb=50, sample_every=25.0):
    """(DRAM KiB per block, in-flight rows MiB, in-flight heads): LRU over 32 KiB records, programs advancing one
    block per step (PER_ITEM steps between items); a Q+dO miss reads 32 KiB, a dQ miss reads and later writes 32 KiB.
    Every ``sample_every`` steps: the distinct (head, query tile) pairs the items in flight (each program's current
    one) walk, at 64 KiB each (Q + dO bf16, dQ fp32; L2 holds 50 MB), and their distinct heads (means)."""
    cache, cap, misses, blocks = OrderedDict(), l2_mb * 1024 // 32, [0, 0], 0
    current = [0] * SMS
    pairs, heads_seen, next_sample = [], [], sample_every
    heap = [(0.0, p, 0, 0) for p in range(SMS)]
    while heap:
        clock, p, i, t = heapq.heappop(heap)
        if clock >= next_sample:
            flight = [mine[q][current[q]] for q in range(SMS) if current[q] < len(mine[q])]
            touched = set().union(*flight) if flight else set()
            pairs.append(len(touched))
            heads_seen.append(len({h for h, _ in touched}))
            next_sample += sample_every
        if i >= len(mine[p]):
            current[p] = i
            continue
        walk = mine[p][i]
        if t >= len(walk):
            current[p] = i + 1
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
    return (32 * misses[0] + 64 * misses[1]) / blocks, np.mean(pairs) * 64 / 1024, np.mean(heads_seen)


# Helper sparsehg47's head-group terms (bench/NOTES.md "Sparse backward head groups by rule"): a block's time is
# b + BETA x its DRAM KiB (a miss's bytes at one SM's share of HBM: 3.35 TB/s / 132 SMs = 25.4 KB/us on the H100,
# i.e. no overlap of misses with the block's math), the busiest SM's load (``imbalance``) scaling the lot.
BLOCK_US = 2.44  # per 64-row block of D128 at one q head per kv head (sparsebwd45's fit, bench/NOTES.md)
BETA_US_PER_KIB = 1024 / (3.35e12 / SMS) * 1e6


def group_terms(lens, heads_kv, keep, causal, groups, head_dim=128, q_per_kv=1, l2_mb=50, seed=0):
    """{G: (imbalance, DRAM KiB per block, modelled us per block incl. imbalance)} of the shipped sparse order
    (``item_list`` with ``zigzag_groups`` in groups of G kv heads, the snake) on a random top-k selection of
    ``lens``. A record is a 64-row tile of one kv head's Q + dO (bf16) or fp32 dQ over its ``q_per_kv`` q heads:
    32 KiB at D128 and one q head, so the L2 holds ``l2_mb`` x 128 / D / q_per_kv records of the model's 32 KiB."""
    tiles = items(lens, heads_kv, keep, causal, seed)
    scale = head_dim / 128 * q_per_kv  # real bytes per model record over 32 KiB
    out = {}
    for g in groups:
        mine = group_order(tiles, g)
        kib, _, _ = l2_model(mine, l2_mb=l2_mb / scale)
        imb = imbalance(mine)
        out[g] = (imb, kib * scale, imb * (BLOCK_US * scale + BETA_US_PER_KIB * kib * scale))
    return out


def group_order(tiles, group):
    """Each program's walks under the shipped block-sparse order (``orders``' "hgG zigzag"; group 0: the item order
    without head groups)."""
    return per_program([walk for _, _, walk in listed_items(tiles, group)], True)


def listed_items(tiles, group):
    """(tile, kv head, walk) of every item in the order the code itself lists them (``block_sparse_bwd.item_list``
    on CPU tensors of this selection, head groups of ``group``; 0: none)."""
    import torch

    from jfa_ops.backends.triton.block_sparse_bwd import item_list

    n, heads = len(tiles), len(tiles[0][2])
    q_count = torch.zeros((max(t[0] for t in tiles) + 1, heads, max(t[1] for t in tiles) + 1), dtype=torch.int32)
    for s, j, walks in tiles:
        for h in range(heads):
            q_count[s, h, j] = len(walks[h]) // 2
    schedule = dict(TILE_SEQ=torch.tensor([t[0] for t in tiles], dtype=torch.int32),
                    TILE_START=torch.tensor([t[1] * BLOCK for t in tiles], dtype=torch.int32),
                    TILE_COUNT=torch.tensor([n], dtype=torch.int32))
    index = {(t[0], t[1]): i for i, t in enumerate(tiles)}
    seq, start, head = item_list(schedule, q_count, heads, BLOCK, group)
    return [(index[(s, b // BLOCK)], h, tiles[index[(s, b // BLOCK)]][2][h])
            for s, b, h in zip(seq.tolist(), start.tolist(), head.tolist())]


def group_grid():
    """(label, lens, heads_kv, head_dim, q_per_kv, keep, causal) of ``--groups``: the bench's lengths (and doubled),
    22 x 1k (one head's rows fit the L2), uniform long ones, jagged short ones, a few long among short; keeps 0.1-0.75,
    causal and not; D64 and GQA on the bench's lengths and on long ones."""
    bench = sparse_cases([128], "quick")[0].kv_lens
    shapes = {"bench": bench, "22 x 1k": (1024,) * 22, "4 x 16k": (16384,) * 4,
              "64 jagged": tuple(128 * (1 + (i * 37) % 24) for i in range(64)), "32 x 4k": (4096,) * 32,
              "bench x2": tuple(2 * n for n in bench), "3 x 16k + 8 x 2k": (16384,) * 3 + (2048,) * 8,
              "2 x 32k + 16 x 1k": (32768,) * 2 + (1024,) * 16}
    grid = [(name, lens, 16, 128, 1, keep, causal) for name, lens in shapes.items() for causal in (False, True)
            for keep in (0.1, 0.25, 0.5, 0.75)]
    for keep in (0.25, 0.5):
        for causal in (False, True):
            grid += [("bench D64", bench, 16, 64, 1, keep, causal), ("bench GQA 2:1", bench, 8, 128, 2, keep, causal),
                     ("bench GQA 4:1", bench, 4, 128, 4, keep, causal),
                     ("4 x 7.5k GQA 2:1", (7680,) * 4, 8, 128, 2, keep, causal),
                     ("4 x 32k D64", (32768,) * 4, 16, 64, 1, keep, causal)]
    return grid


def rule_group(lens, heads_kv, head_dim, q_per_kv, causal, l2_bytes=50 << 20):
    """``configs.sparse_auto_head_group`` on a self-attention batch of ``lens`` (this model's SMs)."""
    from jfa_ops.backends.tlx.configs import head_group, sparse_auto_head_group

    g = sparse_auto_head_group(heads_kv, q_per_kv, head_dim, sum(lens), sum(lens), len(lens), max(lens), causal, SMS,
                               l2_bytes)
    return head_group(heads_kv, g, sparse=True)


def print_group_grid() -> None:
    """``--groups``: per grid case the model's terms for groups of 1, 2, 4 (t2/t: the shipped group 2's modelled time
    over this one's), the model's best group and the rule's (``rule_group``)."""
    for name, lens, hkv, d, gq, keep, causal in group_grid():
        groups = [g for g in (1, 2, 4) if hkv % g == 0 and g < hkv]
        terms = group_terms(lens, hkv, keep, causal, groups, head_dim=d, q_per_kv=gq)
        best = min(terms, key=lambda g: terms[g][2])
        rule = rule_group(lens, hkv, d, gq, causal)
        print(f"{name:18s} Hkv{hkv:<2d} D{d:<3d} keep {keep:<4} {'causal' if causal else 'full  '} " + "  ".join(
            f"hg{g} imb {terms[g][0]:.3f} DRAM {terms[g][1]:5.1f} t2/t {terms[2][2] / terms[g][2]:.3f}"
            for g in groups) + f"  model hg{best}, rule hg{rule} (t2/t {terms[2][2] / terms[rule][2]:.3f})",
            flush=True)


CASES = ((1.0, False), (0.5, False), (0.25, False), (1.0, True), (0.5, True), (0.25, True))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    l2, schedules = "--l2" in argv, "--schedules" in argv
    if "--groups" in argv:  # helper sparsehg47: the head-group rule against the model (~2 min)
        print_group_grid()
        return 0
    case = sparse_cases([128], "quick")[0]
    lens, heads = case.kv_lens, case.num_heads_kv
    print(f"T{sum(lens)}, {len(lens)} sequences, H{heads}; items (key tile, kv head), blocks = 64-row query tiles")
    for keep, causal in CASES:
        tiles = items(lens, heads, keep, causal)
        work = [w for _, _, walks in tiles for w in walks]
        n = np.array([len(w) for w in work])
        costs = list(n + PER_ITEM)
        line = (f"keep {keep} {'causal' if causal else 'full  '}: items {len(work)} blocks {n.sum()} mean "
                f"{n.mean():.1f} median {np.median(n):.0f} p90 {np.percentile(n, 90):.0f} max {n.max()}; busiest SM "
                f"over mean: tile-major {imbalance_of(costs):.4f}, item order (sorted, snake) "
                f"{imbalance_of(sorted(costs, reverse=True), True):.4f}, LPT {lpt(costs):.4f}")
        print(line, flush=True)
        if not (schedules or l2) or (keep == 1.0 and not schedules):
            continue
        for name, mine in orders(tiles).items():
            busiest = max(sum(len(w) for w in m) for m in mine)
            line = f"    {name:20s} busiest SM {imbalance(mine):.4f} ({busiest} blocks)"
            if l2:
                kib, mib, hs = l2_model(mine)
                line += f"; DRAM {kib:.1f} KiB/block; in flight: {mib:.0f} MiB of rows, {hs:.1f} heads"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
