"""CPU model of why DQ_LAST (``configs.BACKWARD_DQ_LAST``, helper dqlast48) lost on the bench's sparse and dense
backward rows (helper dqdiag49, bench/NOTES.md "Issue 11: why DQ_LAST lost"): an event simulation of the TLX
backward's persistent programs, each walking its items in the kernel's static order, with DQ_LAST's per-item
arrivals processed in time order across programs. An item's arrival counts its tiles down; a (tile, head) whose
count reaches 0 is finalized there, serially, by the arriving program's consumers (both halves at once), which
delays that program's later items. Nothing else couples the programs.

Per row: ``tb`` (us per 64-row block) is fitted so that the simulation without DQ_LAST gives the measured default
kernel time; an item costs ``PER_ITEM`` blocks more. DQ_LAST adds ``A`` us per item (landing wait, fence, the walk
again, the atomics' round trip, the reductions) and ``F`` us per finalized tile (its [64, D/2] fp32 read at L2
after a 128-lane reduction and two barriers, the bf16 store). ``python tools/dq_last_model.py [A F] [--halves J]``
(~15 s a setting; --halves J: each consumer's column half counted on its own, arrivals jittered by up to J us,
``simulate_halves``).
"""
from __future__ import annotations

import heapq
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sparse_bwd_model import SMS, PER_ITEM, group_order, items, per_program  # noqa: E402

from bench.suites import sparse_cases  # noqa: E402

# stop 49's H100 kernel us per call (bench/NOTES.md): default, DQ_LAST (attn_bwd_tlx_kernel alone); a dense row's keep
# is the sparse row it was timed beside (the dense kernel is the same for both: two runs of one row)
MEASURED = {("sparse", 0.5, False): (11728, 19844), ("sparse", 0.25, False): (6323, 11637),
            ("sparse", 0.5, True): (7346, 11806), ("sparse", 0.25, True): (4483, 7000),
            ("dense", 0.5, False): (26849, 28650), ("dense", 0.25, False): (26554, 28736),
            ("dense", 0.5, True): (12284, 16974), ("dense", 0.25, True): (12271, 17503)}
HEAD_GROUP = 2  # configs.SPARSE_HEAD_GROUP under the group order (the block-sparse default)


def programs_of(kind, keep, causal, lens, heads):
    """Each program's item walks [(head, query tile)] in the kernel's order: block-sparse, the group order's list
    (head groups of 2, zigzag, snake); dense, tile-major static striding (key tiles x kv heads); dense causal, the
    causal order's list approximated as longest first under the snake."""
    if kind == "sparse":
        return group_order(items(lens, heads, keep, causal), HEAD_GROUP)
    tiles = items(lens, heads, 1.0, causal)
    tile_major = [tiles[t][2][h] for t in range(len(tiles)) for h in range(heads)]
    if causal:  # CAUSAL_ORDER_JAGGED's list, approximated: longest first (stable), snake (its L2 sections left out)
        return per_program(sorted(tile_major, key=lambda w: -len(w)), True)
    return per_program(tile_major, False)


def simulate(progs, tb, a_us=0.0, f_us=0.0):
    """(kernel us, each program's finalized (head, tile)s, the most finalized in one arrival) of ``progs`` (each
    program's walks, lists of (head, query tile)) at ``tb`` us a block; a_us / f_us: DQ_LAST's per-item and
    per-finalized-tile costs (0, 0: without DQ_LAST, no arrivals counted)."""
    count = Counter(key for mine in progs for walk in mine for key in walk)
    heap = [(PER_ITEM * tb + len(mine[0]) * tb, p, 0) for p, mine in enumerate(progs) if mine]
    heapq.heapify(heap)
    end, finals, burst = [0.0] * len(progs), [0] * len(progs), 0
    while heap:
        t, p, i = heapq.heappop(heap)
        if a_us or f_us:
            last = 0
            for key in progs[p][i]:
                count[key] -= 1
                last += count[key] == 0
            finals[p] += last
            burst = max(burst, last)
            t += a_us + last * f_us
        end[p] = t
        if i + 1 < len(progs[p]):
            heapq.heappush(heap, (t + (PER_ITEM + len(progs[p][i + 1])) * tb, p, i + 1))
    return max(end), finals, burst


def simulate_halves(progs, tb, a_us, f_us, jitter_us, seed=0):
    """``simulate`` with each consumer's column half counted on its own (the kernel's counters are per (tile, head,
    half)): the two consumers of an item arrive at its end plus a jitter uniform in [0, jitter_us) each, so a tile's
    two halves can be finalized by two programs; a program's next item starts when both its consumers are done (the
    next block's barrier). (kernel us, each program's finalized half-tiles, the most in one consumer's arrival)."""
    import random

    rng = random.Random(seed)
    count = Counter((key, c) for mine in progs for walk in mine for key in walk for c in (0, 1))
    heap = []

    def start(p, i, t):
        end_item = t + (PER_ITEM + len(progs[p][i])) * tb
        for c in (0, 1):
            heapq.heappush(heap, (end_item + rng.random() * jitter_us, p, i, c))
    for p, mine in enumerate(progs):
        if mine:
            start(p, 0, 0.0)
    end, finals, burst, done = [0.0] * len(progs), [0] * len(progs), 0, {}
    while heap:
        t, p, i, c = heapq.heappop(heap)
        last = 0
        for key in progs[p][i]:
            count[(key, c)] -= 1
            last += count[(key, c)] == 0
        finals[p] += last
        burst = max(burst, last)
        t += a_us + last * f_us
        if (p, i) not in done:
            done[(p, i)] = t
            continue
        t = max(t, done.pop((p, i)))
        end[p] = t
        if i + 1 < len(progs[p]):
            start(p, i + 1, t)
    return max(end), finals, burst


def fit_tb(progs, measured_us):
    """tb such that the simulation without DQ_LAST gives measured_us (linear in tb)."""
    return measured_us / simulate(progs, 1.0)[0]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    jitter = None
    if "--halves" in argv:  # each consumer's half on its own, arrivals jittered by the next value (us)
        k = argv.index("--halves")
        jitter, argv = float(argv[k + 1]), argv[:k] + argv[k + 2:]
    grid = [(float(argv[0]), float(argv[1]))] if len(argv) == 2 else [(a, f) for a in (0.0, 3.0, 6.0)
                                                                      for f in (0.0, 1.0, 2.0, 3.0)]
    case = sparse_cases([128], "quick")[0]
    lens, heads = case.kv_lens, case.num_heads_kv
    rows = []
    for (kind, keep, causal), (base, dqlast) in MEASURED.items():
        progs = programs_of(kind, keep, causal, lens, heads)
        tb = fit_tb(progs, base)
        items_per = sum(len(m) for m in progs) / len(progs)
        blocks_per = sum(len(w) for m in progs for w in m) / len(progs)
        rows.append((kind, keep, causal, base, dqlast, progs, tb))
        print(f"{kind:6s} keep {keep} {'causal' if causal else 'full  '}: items/SM {items_per:5.1f} blocks/SM "
              f"{blocks_per:7.0f} tb {tb:5.2f} us; measured +{dqlast - base} us", flush=True)
    for a_us, f_us in grid:
        line = []
        for kind, keep, causal, base, dqlast, progs, tb in rows:
            t, finals, burst = (simulate(progs, tb, a_us, f_us) if jitter is None
                                else simulate_halves(progs, tb, a_us, f_us, jitter))
            fin = max(finals)
            mean = sum(finals) / len(finals)
            ratio = (t - base) / (dqlast - base)
            line.append(f"{t - base:6.0f} ({ratio:4.2f}x, fin {fin} / {mean:.0f}, burst {burst})")
        print(f"A {a_us:4.2f} F {f_us:4.2f}: " + " | ".join(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
