"""CPU model of the TLX forward's work schedule (bench/NOTES.md "TLX forward: short causal (helper tlxcausal)"): for
the bench's D128 dense and jagged cases, each work order as the kernel takes it on 132 programs (items = (query tile
of 128 rows, head), key blocks of 128), the busiest program's cost over the mean (its makespan: key blocks plus
``PER_ITEM`` blocks per item), and with ``--l2`` a coarse L2 model: LRU over the 64 KiB K+V blocks of (sequence, kv
head, key block), 40 MiB, the programs advancing one block per step; DRAM KiB read per block (Q and O move once
whatever the order; left out).

Orders: ``default`` (what the kernel takes today, ``configs.fwd_choices``: kv-major static striding for dense
batches and unmasked jagged ones, tile-major for masked jagged ones), ``zigzag`` (``configs.FORWARD_ZIGZAG``:
``common.zigzag_item``'s order over kv-head groups of ``configs.fwd_head_group``'s size, taken by the snake),
``zigzag Gn`` (groups of n), ``greedy`` (the dynamic reference: each item of the tile-major list to the first
program free, what an atomic work counter or FA4's one-CTA-per-tile grid gives).

``python tools/fwd_schedule_model.py [--l2] [--suite quick|full]`` (--l2: ~1 min per case on one core).
"""
from __future__ import annotations

import heapq
import importlib.util
import os
import sys
from collections import OrderedDict

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.suites import Case, dense_cases, jagged_cases, JAGGED_SEED, lognormal_lengths  # noqa: E402

SMS, BLOCK_M, BLOCK_N = 132, 128, 128
# An item's fixed cost in blocks (Q wait, the first block's unoverlapped QK^T, the epilogue): the H200's dense rows
# put it near 0 (S2048 and S8192 at 1.78 / 1.83 us per block, 16 and 64 blocks per item), so a small guess.
PER_ITEM = 0.25


def _tlx_configs():
    """``jfa_ops/backends/tlx/configs.py`` loaded by path: the package itself needs TLX to import."""
    spec = importlib.util.spec_from_file_location("tlx_configs", os.path.join(ROOT, "jfa_ops/backends/tlx/configs.py"))
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    module.__package__ = "jfa_ops.backends.tlx"  # its relative import (..gqa_split: pure Python) resolves, no TLX
    spec.loader.exec_module(module)
    return module


CONFIGS = _tlx_configs()


def tiles(lens, causal):
    """The tile list as ``scheduling.build_tiles`` sorts it, (seq, first row, key blocks), descending by its cost
    (rows x visible keys; stable: ties in (seq, start) order)."""
    out = []
    for s, n in enumerate(lens):
        for m0 in range(0, n, BLOCK_M):
            rows = min(BLOCK_M, n - m0)
            hi = m0 + rows if causal else n
            out.append((rows * hi, s, m0, -(-hi // BLOCK_N)))
    out.sort(key=lambda t: -t[0])
    return [t[1:] for t in out]


def capacity(lens):
    """``scheduling.capacity_of``: the list's slots (an upper bound on its tiles)."""
    return -(-((sum(lens) + BLOCK_M - 1) // BLOCK_M + len(lens)) // 4) * 4


def work_item(w, n_tiles, heads, group, kv_major):
    """``common.work_item``: (tile, head) of work index w."""
    if kv_major:
        g, rest = w % group, w // group
        return rest % n_tiles, (rest // n_tiles) * group + g
    return w // heads, w % heads


def zigzag_item(w, n_tiles, heads, group, head_group):
    """``common.zigzag_item`` (tests/backends/test_item_order.py checks the kernel's against this one)."""
    span = head_group * group
    hg, r = divmod(w, n_tiles * span)
    rank, j = divmod(r, span)
    last = heads // span - 1
    return (rank if (last - hg) % 2 == 0 else n_tiles - 1 - rank), hg * span + j


def snake(w):
    """(program, round) of work index w under ``common.snake_work``."""
    i, c = divmod(w, SMS)
    return (c if i % 2 == 0 else SMS - 1 - c), i


def programs_of(tile_list, heads, group, mapping, use_snake):
    """Each program's items (seq, first row, head, blocks), in its order: static striding or the snake over
    ``mapping(w) -> (tile, head)``."""
    out = [[] for _ in range(SMS)]
    for w in range(len(tile_list) * heads):
        t, h = mapping(w)
        s, m0, b = tile_list[t]
        out[snake(w)[0] if use_snake else w % SMS].append((s, m0, h // group, b))
    return out


def greedy(tile_list, heads, group):
    heap = [(0.0, p) for p in range(SMS)]
    out = [[] for _ in range(SMS)]
    for w in range(len(tile_list) * heads):
        s, m0, b = tile_list[w // heads]
        t, p = heapq.heappop(heap)
        out[p].append((s, m0, w % heads // group, b))
        heapq.heappush(heap, (t + b + PER_ITEM, p))
    return out


def busiest(programs):
    """(busiest program's cost over the mean, its cost in blocks)."""
    loads = np.array([sum(b + PER_ITEM for *_, b in mine) for mine in programs])
    return loads.max() / loads.mean(), loads.max()


def lru_miss(cache: OrderedDict, key, cap: int) -> bool:
    """One access to an LRU of ``cap`` entries (``cache``, updated): whether ``key`` missed."""
    if key in cache:
        cache.move_to_end(key)
        return False
    cache[key] = 1
    if len(cache) > cap:
        cache.popitem(last=False)
    return True


def l2_model(programs, l2_mib=40, blocks_of=None, per_item=PER_ITEM):
    """DRAM KiB per key block: LRU over 64 KiB K+V blocks, programs one block per step (``per_item`` steps between
    items). ``blocks_of(item)``: the item's K+V block keys in visiting order (default: a dense item (seq, _, kv head,
    blocks) visits blocks 0..blocks-1; tools/sparse_fwd_model.py passes its selected blocks)."""
    if blocks_of is None:
        blocks_of = lambda item: [(item[0], item[2], j) for j in range(item[3])]  # noqa: E731
    walks = [[blocks_of(item) for item in mine] for mine in programs]
    cache, cap, misses, blocks = OrderedDict(), l2_mib * 1024 // 64, 0, 0
    heap = [(0.0, p, 0, 0) for p in range(SMS) if programs[p]]
    while heap:
        clock, p, i, j = heapq.heappop(heap)
        misses += lru_miss(cache, walks[p][i][j], cap)
        blocks += 1
        if j + 1 < len(walks[p][i]):
            heapq.heappush(heap, (clock + 1.0, p, i, j + 1))
        elif i + 1 < len(programs[p]):
            heapq.heappush(heap, (clock + 1.0 + per_item, p, i + 1, 0))
    return 64 * misses / blocks


def schedules(case):
    """Name -> each program's items under every order modelled."""
    lens, heads, heads_kv = case.q_lens, case.num_heads_q, case.num_heads_kv
    group = heads // heads_kv
    tile_list = tiles(lens, case.causal)
    n = len(tile_list)
    uniform = case.dense
    kv_major = CONFIGS.fwd_choices(CONFIGS.fwd_config(128), case.causal, False, uniform)[1]
    rule = CONFIGS.fwd_head_group(heads_kv, group, capacity(lens), SMS, uniform, head_group=None)
    plans = {"default": programs_of(tile_list, heads, group, lambda w: work_item(w, n, heads, group, kv_major),
                                    False),
             f"zigzag (G{rule})": programs_of(tile_list, heads, group,
                                              lambda w: zigzag_item(w, n, heads, group, rule), True)}
    for g in (1, 2, 4, 8, 16):
        if heads_kv % g == 0 and g != rule:
            plans[f"zigzag G{g}"] = programs_of(tile_list, heads, group, lambda w: zigzag_item(w, n, heads, group, g),
                                                True)
    plans["greedy"] = greedy(tile_list, heads, group)
    return kv_major, plans


def cases(suite):
    out = dense_cases([128], suite) + jagged_cases([128], suite)
    lens = lognormal_lengths(32768, None, seed=JAGGED_SEED)  # tools/tlx_check.py's GQA row
    out.append(Case("gqa", "jagged GQA 32:4 causal", lens, lens, 32, 4, 128, causal=True))
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    l2 = "--l2" in argv
    suite = argv[argv.index("--suite") + 1] if "--suite" in argv else "quick"
    for case in cases(suite):
        if CONFIGS.FORWARD_HEAD_GROUP is not None:
            raise SystemExit("unset JFA_TLX_FWD_HEAD_GROUP: the model prints the rule's group")
        kv_major, plans = schedules(case)
        print(f"{case.suite} {case.name}: {len(case.q_lens)} sequences, H{case.num_heads_q}:{case.num_heads_kv}, "
              f"{len(tiles(case.q_lens, case.causal))} tiles, default {'kv-major' if kv_major else 'tile-major'}",
              flush=True)
        print_orders(plans, l2)
    return 0


def print_orders(plans, l2, busiest=busiest, l2_model=l2_model, unit="blocks"):
    """One line per work order: the busiest program over the mean and, with ``l2``, the DRAM bytes per block
    (tools/sparse_fwd_model.py passes its own item-aware ``busiest`` and ``l2_model``)."""
    for name, programs in plans.items():
        over, most = busiest(programs)
        line = f"    {name:14s} busiest {over:.3f} x mean ({most:.0f} {unit})"
        if l2:
            line += f"; DRAM {l2_model(programs):.1f} KiB/block"
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
