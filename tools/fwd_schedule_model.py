"""CPU model of the TLX forward's work schedule (bench/NOTES.md "TLX forward: short causal (helper tlxcausal)"):
for the bench's dense and jagged D128 cases, each work order as the kernel takes it (static persistent striding of
132 programs over items (query tile of 128 rows, head), or a snake), the busiest program's key blocks over the mean
(the makespan, with ``PER_ITEM`` blocks of fixed cost per item), and with ``--l2`` a coarse L2 model: LRU over the
64 KiB K+V blocks of a (sequence, kv head, key block), the programs advancing one block per step, and the DRAM KiB
read per block (Q and O are read/written once either way and left out).

Orders: ``kv-major`` (``common.work_item`` KV_MAJOR: the default for uniform batches), ``tile-major`` (the default
for masked jagged batches), ``hgG`` (kv-major in groups of G heads: the backward's HEAD_GROUP), and the item lists
(``tlx.attn_fwd.fwd_item_list``: the tile list's items sorted longest first by their own blocks, heads in groups of
G, taken by the snake); ``greedy`` is the dynamic reference (each item to the first program free, in the list order:
what an atomic work counter or FA4's one-CTA-per-tile grid gives).

``python tools/fwd_schedule_model.py [--l2] [--cases dense]`` (--l2: ~1 min per case on one core).
"""
from __future__ import annotations

import heapq
import os
import sys
from collections import OrderedDict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.suites import dense_cases, jagged_cases  # noqa: E402

SMS, BLOCK_M, BLOCK_N = 132, 128, 128
PER_ITEM = 0.25  # an item's fixed cost in blocks (Q wait, first softmax, epilogue); the H200's dense S2048 vs
# S8192 rows put it near 0 (bench/NOTES.md "TLX forward: short causal")


def tiles(lens, causal):
    """The tile list as ``scheduling.build_tiles`` sorts it: (seq, first row, key blocks), descending by cost
    (rows x visible keys), ties in (seq, start) order."""
    out = []
    for s, n in enumerate(lens):
        for m0 in range(0, n, BLOCK_M):
            rows = min(BLOCK_M, n - m0)
            hi = min(m0 + rows, n) if causal else n
            out.append((rows * hi, s, m0, -(-hi // BLOCK_N)))
    out.sort(key=lambda t: -t[0])  # stable
    return [t[1:] for t in out]


def kernel_items(tile_list, heads, order, group=1):
    """Work index -> (seq, first row, head, blocks) as ``common.work_item`` maps it (kv-major, tile-major, or
    kv-major in groups of ``group`` heads: hgG)."""
    n = len(tile_list)
    out = []
    for w in range(n * heads):
        if order == "tile-major":
            t, h = divmod(w, heads)
        else:  # kv-major (group 1) / hgG: heads of a group innermost, then tiles, then groups
            g, rest = w % group, w // group
            t, h = rest % n, (rest // n) * group + g
        s, m0, b = tile_list[t]
        out.append((s, m0, h, b))
    return out


def per_program(work, snake):
    """Each program's items: static striding (pid + i x programs) or the snake (``common.snake_work``)."""
    if not snake:
        return [work[p::SMS] for p in range(SMS)]
    out = [[] for _ in range(SMS)]
    for w, item in enumerate(work):
        i, c = divmod(w, SMS)
        out[c if i % 2 == 0 else SMS - 1 - c].append(item)
    return out


def greedy(work):
    """Dynamic reference: each item in list order to the program that frees first."""
    heap = [(0.0, p) for p in range(SMS)]
    out = [[] for _ in range(SMS)]
    for item in work:
        t, p = heapq.heappop(heap)
        out[p].append(item)
        heapq.heappush(heap, (t + item[3] + PER_ITEM, p))
    return out


def load(mine):
    return sum(b + PER_ITEM for *_, b in mine)


def busiest(programs):
    """(busiest program's cost over the mean, busiest cost in blocks)."""
    loads = np.array([load(m) for m in programs])
    return loads.max() / loads.mean(), loads.max()


def l2_model(programs, l2_mib=40):
    """DRAM KiB per block: LRU over 64 KiB K+V blocks, programs one block per step (PER_ITEM steps between items)."""
    cache, cap, misses, blocks = OrderedDict(), l2_mib * 1024 // 64, 0, 0
    heap = [(0.0, p, 0, 0) for p in range(SMS) if programs[p]]
    while heap:
        clock, p, i, j = heapq.heappop(heap)
        s, m0, h, b = programs[p][i]
        key = (s, h, j)
        if key in cache:
            cache.move_to_end(key)
        else:
            misses += 1
            cache[key] = 1
            if len(cache) > cap:
                cache.popitem(last=False)
        blocks += 1
        if j + 1 < b:
            heapq.heappush(heap, (clock + 1.0, p, i, j + 1))
        elif i + 1 < len(programs[p]):
            heapq.heappush(heap, (clock + 1.0 + PER_ITEM, p, i + 1, 0))
    return 64 * misses / blocks


def schedules(lens, heads, causal):
    """Name -> each program's items, for every order the kernel can take (the item lists by the code itself)."""
    import torch

    from jfa_ops.backends.tlx.attn_fwd import fwd_item_list

    tile_list = tiles(lens, causal)
    seq = torch.tensor([t[0] for t in tile_list], dtype=torch.int32)
    start = torch.tensor([t[1] for t in tile_list], dtype=torch.int32)
    blocks = {(t[0], t[1]): t[2] for t in tile_list}
    q_off = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)

    def listed(group):
        s, m, h = fwd_item_list(seq, start, torch.tensor([len(tile_list)], dtype=torch.int32), q_off, q_off, heads,
                                1, BLOCK_M, BLOCK_N, causal, group)
        return [(a, b, c, blocks[(a, b)]) for a, b, c in zip(s.tolist(), m.tolist(), h.tolist()) if a >= 0]

    plans = {"kv-major": per_program(kernel_items(tile_list, heads, "kv-major"), False),
             "tile-major": per_program(kernel_items(tile_list, heads, "tile-major"), False),
             "hg4": per_program(kernel_items(tile_list, heads, "hg", 4), False)}
    for group in (0, 2, 4):
        plans[f"list hg{group} snake" if group else "list snake"] = per_program(listed(group), True)
    plans["greedy tile-major"] = greedy(kernel_items(tile_list, heads, "tile-major"))
    plans["greedy hg4"] = greedy(kernel_items(tile_list, heads, "hg", 4))
    return plans


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    l2 = "--l2" in argv
    which = argv[argv.index("--cases") + 1] if "--cases" in argv else "dense,jagged"
    cases = [c for c in dense_cases([128], "quick") + jagged_cases([128], "quick") if c.suite in which.split(",")]
    for case in cases:
        lens, heads = case.q_lens, case.num_heads_q
        print(f"{case.suite} {case.name}: {len(lens)} sequences, H{heads}", flush=True)
        for name, programs in schedules(lens, heads, case.causal).items():
            over, most = busiest(programs)
            line = f"    {name:18s} busiest SM {over:.4f} x mean ({most:.0f} blocks)"
            if l2:
                line += f"; DRAM {l2_model(programs):.1f} KiB/block"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
