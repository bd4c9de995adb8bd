"""L2 model of the TLX block-sparse forward's work order on the bench's sparse batch (bench/NOTES.md "Issue 11: the
causal work order, helper order39"): which order of the work items (128-row Q tile, head) keeps the selected K/V
blocks in the L2, calibrated on what the H200 measured.

The batch: ``bench.suites.sparse_cases`` quick (T66944 n22 H16 D128 bf16, 128-blocks); the selection: the reference
``select_kv_blocks`` on CPU over ``make_inputs(case, "cpu")`` (the bench draws the same normal inputs on the GPU; the
pooled scores are as random there), cached in /tmp. The list: ``scheduling.build_tiles``' (slots in (sequence, start)
order, stable-sorted by the selected blocks summed over the heads, descending). Orders (each program's items as the
kernel takes them, 132 programs):

- ``zigzag G2`` (today's default, ``configs.SPARSE_FORWARD_ZIGZAG``): ``common.zigzag_item`` over kv-head groups of
  ``configs.fwd_head_group`` (2 here), by the snake; ``zigzag Gn``: other groups;
- ``v18 default`` (the order before zigzag, for calibration): kv-major static striding unmasked, tile-major masked;
- ``streams alt Gn`` (``configs.SPARSE_FORWARD_ORDER`` "streams", with G2 the knob's order): the list re-sorted
  sequence-major (``block_sparse_fwd.stream_major_cost``: each sequence's tiles together, the sequence with the most
  selected blocks first, its tiles by cost, every other sequence ascending), then the same zigzag over kv-head groups
  of n by the snake: the ~132 items in flight hold one or a few (sequence, head) streams' walks instead of every
  sequence's; ``streams Gn``: every sequence descending (a sawtooth: the snake's rounds stop pairing long with short
  and the programs drift apart in time, which spreads the items in flight over more streams again).

Time model per program (a persistent program per SM): ``a`` us per work item, ``b`` per selected block (sparse38's
fit: 1.84 / 3.70), plus ``c`` us per K+V block read from DRAM; the run is the busiest program. The L2: LRU over 64 KiB
K+V blocks of (sequence, kv head, key block) plus each item's Q tile read and output tile written (32 KiB each,
streaming), ``C`` MiB, optionally as two halves each fed by half the programs (``sides=2``: Hopper's two L2
partitions each caching what their SMs read). Programs advance in time (an event per block, a missed block taking
b + c), so the interleaving of their reads is the kernel's, not one block per step.

``python tools/sparse_order_model.py [--fit] [--orders] [--predict] [--tlb] [--queue]`` (~1-5 min per part on one
core).
"""
from __future__ import annotations

import heapq
import math
import os
import sys
from collections import OrderedDict

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import fwd_schedule_model as fsm  # noqa: E402

SMS, BLOCK = 132, 128
B_US, A_US = 1.84, 3.70  # per selected block, per work item (bench/NOTES.md "helper sparse38")
ITEM_UNITS = 0.5  # Q tile read and output tile written per item: 32 KiB each, in 64 KiB units


def cases():
    from bench.suites import sparse_cases
    return list(sparse_cases([128], "quick"))


def selection(case, cache_dir="/tmp/order39_sel"):
    """(index [B, H, N, W] int32, count [B, H, N] int32) of the reference selection over the bench's inputs drawn
    on CPU (cached)."""
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f"{case.name.replace(' ', '_')}.npz")
    if os.path.exists(path):
        z = np.load(path)
        return z["index"], z["count"]
    import jfa_ops
    from bench.suites import make_inputs
    x = make_inputs(case, "cpu")
    index, count = jfa_ops.select_kv_blocks(x.q, x.k, x.q_offsets, x.kv_offsets, case.max_q, case.max_kv,
                                            keep_ratio=case.keep_ratio, block_q=case.block, block_kv=case.block,
                                            causal=case.causal, backend="reference")
    index, count = index.numpy().astype(np.int32), count.numpy().astype(np.int32)
    np.savez(path, index=index, count=count)
    return index, count


def lowest(index, count):
    """``tools/tlx_check.py``'s ``lowest_selection``: the same counts, blocks 0 .. c - 2 and the local one."""
    i = np.arange(index.shape[2])[None, None, :, None]
    j = np.arange(index.shape[3])[None, None, None, :]
    c = count[..., None]
    last = np.maximum(i, c - 1)
    return np.where(j < c - 1, j, np.where(j == c - 1, last, -1)).astype(np.int32)


def tile_list(lens, count, key=None):
    """(seq, q block) in the list's order: slots in (seq, start) order, stable-sorted descending by the selected
    blocks summed over the heads (``block_sparse_fwd.selected_cost``), or by ``key(seq, q block, cost)``."""
    slots = [(s, i) for s, n in enumerate(lens) for i in range(-(-n // BLOCK))]
    cost = {(s, i): int(count[s, :, i].sum()) for s, i in slots}
    if key is None:
        return sorted(slots, key=lambda t: -cost[t])
    return sorted(slots, key=lambda t: key(t[0], t[1], cost[t]))


def stream_key(count, alternate=True):
    """``block_sparse_fwd.stream_major_cost``'s order as a sort key: the sequence with the most selected blocks
    first (ties: lower index), then the tile's cost descending (ties: slot order); ``alternate`` (the shipped knob's):
    every other sequence's tiles ascending (each sequence a monotone run whose turns are all-long or all-short, the
    zigzag's rule, so the snake keeps pairing long with short); without it the runs make a sawtooth."""
    totals = count.sum(axis=(1, 2))
    rank = {s: r for r, s in enumerate(sorted(range(len(totals)), key=lambda s: (-totals[s], s)))}
    return lambda s, i, cost: (rank[s], cost if alternate and rank[s] % 2 else -cost)


def programs_of(tiles, heads, mapping, snake):
    """Each program's items (seq, head, q block) under ``mapping(w) -> (tile, head)``, by the snake or striding."""
    out = [[] for _ in range(SMS)]
    n = len(tiles)
    for w in range(n * heads):
        t, h = mapping(w)
        s, i = tiles[t]
        out[fsm.snake(w)[0] if snake else w % SMS].append((s, h, i))
    return out


def orders(case, count, which=None):
    """Name -> programs, for the orders of this module's docstring."""
    lens, heads = case.kv_lens, case.num_heads_kv
    base = tile_list(lens, count)
    n = len(base)
    out = {}
    groups = [g for g in (1, 2, 4, 8) if heads % g == 0]
    for g in groups:
        out[f"zigzag G{g}"] = lambda g=g: programs_of(base, heads, lambda w: fsm.zigzag_item(w, n, heads, 1, g), True)
    kv_major = not case.causal  # fwd_choices on a jagged batch: kv-major unless masked
    out["v18 default"] = lambda: programs_of(base, heads, lambda w: fsm.work_item(w, n, heads, 1, kv_major), False)
    for tag, alt in (("streams", False), ("streams alt", True)):
        streams = tile_list(lens, count, stream_key(count, alt))
        for g in groups:
            out[f"{tag} G{g}"] = lambda g=g, streams=streams: programs_of(
                streams, heads, lambda w: fsm.zigzag_item(w, n, heads, 1, g), True)
    return {k: v() for k, v in out.items() if which is None or k in which}


def simulate(programs, index, count, cap_mib, c_us=0.0, sides=1, b_us=B_US, a_us=A_US):
    """Per program (blocks, items, K/V misses, finish us) of one run: each program's items in order, ``a_us`` per
    item, ``b_us`` per block, ``c_us`` more per K+V block missed in the L2 (LRU of ``cap_mib`` MiB, or ``sides``
    caches of cap / sides each fed by programs p % sides; Q and output tiles streamed through it)."""
    cap = cap_mib * 1024 / 64 / sides
    caches = [OrderedDict() for _ in range(sides)]
    used = [0.0] * sides
    stats = np.zeros((SMS, 4))
    walks = [[index[s, h, i, :count[s, h, i]] for s, h, i in mine] for mine in programs]

    def touch(side, key, units):
        cache = caches[side]
        if key in cache:
            cache.move_to_end(key)
            return True
        cache[key] = units
        used[side] += units
        while used[side] > cap:
            used[side] -= cache.popitem(last=False)[1]
        return False

    heap = []
    for p in range(SMS):
        if programs[p]:
            heap.append((0.0, p, 0, -1))
    heapq.heapify(heap)
    while heap:
        clock, p, it, j = heapq.heappop(heap)
        side = p % sides
        s, h, i = programs[p][it]
        walk = walks[p][it]
        if j < 0:  # item start: its Q tile, its fixed cost
            touch(side, ("q", s, h, i), ITEM_UNITS)
            stats[p, 1] += 1
            clock += a_us
            nxt = 0
        else:
            hit = touch(side, (s, h, int(walk[j])), 1.0)
            stats[p, 0] += 1
            clock += b_us + (0.0 if hit else c_us)
            stats[p, 2] += not hit
            nxt = j + 1
        if nxt < len(walk):
            heapq.heappush(heap, (clock, p, it, nxt))
        else:
            touch(side, ("o", s, h, i), ITEM_UNITS)
            if it + 1 < len(programs[p]):
                heapq.heappush(heap, (clock, p, it + 1, -1))
            else:
                stats[p, 3] = clock
    return stats


def run_time(stats, c_us, b_us=B_US, a_us=A_US):
    """The busiest program's us with ``c_us`` per miss (misses counted at another c: their order hardly moves)."""
    return float((stats[:, 0] * b_us + stats[:, 1] * a_us + stats[:, 2] * c_us).max())


# ---------------------------------------------------------------------------------------------- the measurements
# Stop 38's sparse-ablation (H200, three interleaved rounds, ms): default (zigzag G2) and lowsel (the lowest blocks).
ABLATION = {"keep0.5": (4.908, 4.931), "keep0.25": (2.618, 2.623), "keep0.5 causal": (2.743, 2.702),
            "keep0.25 causal": (1.639, 1.530)}
# v18's sparse-timing (H200, one round): dense-equivalent TFLOP/s of the v18 default order and of zigzag G2.
V18 = {"keep0.5": (1094.7, 1115.3), "keep0.25": (2045.3, 2072.5), "keep0.5 causal": (968.7, 990.5),
       "keep0.25 causal": (1568.4, 1666.0)}
# The A/A spread of stop 38's ablation (the same kernel in two columns): ~1.5% on keep 0.5, ~0.6% on keep 0.25.
NOISE = 0.01


def row_key(case):
    return case.name.split(" ", 2)[2].replace("T66944 n22 ", "")


def measured_deltas(case):
    """(lowsel's saving over default, zigzag G2's saving over the v18 default), us (> 0: faster)."""
    k = row_key(case)
    d, low = ABLATION[k]
    v_def, v_zz = V18[k]
    flops = case.flops("fwd") / 1e6  # MFLOP: us = MFLOP / TFLOP/s
    return (d - low) * 1e3, flops / v_def - flops / v_zz


def fit(caps=(10, 15, 20, 25, 30, 40, 50), sides_list=(1, 2), c_grid=np.arange(0.0, 4.01, 0.05)):
    """For each L2 size and side count: the miss cost c that best fits the eight measured savings (lowsel and
    zigzag G2 over the v18 default, per row; weighted by 1 / (NOISE x the row's time)), and the residuals."""
    rows = []
    for case in cases():
        index, count = selection(case)
        low = lowest(index, count)
        progs = orders(case, count, ("zigzag G2", "v18 default"))
        rows.append((case, index, count, low, progs))
    print(f"{'L2 MiB':>6s} {'sides':>5s} {'c us':>5s} {'rms (sd)':>8s}  " + "  ".join(
        f"{row_key(r[0]):>16s}" for r in rows) + "   (measured / model saving, us: lowsel; zigzag over v18)")
    best = None
    for sides in sides_list:
        for cap in caps:
            sims = []
            for case, index, count, low, progs in rows:
                sims.append((simulate(progs["zigzag G2"], index, count, cap, 1.0, sides),
                             simulate(progs["zigzag G2"], low, count, cap, 1.0, sides),
                             simulate(progs["v18 default"], index, count, cap, 1.0, sides)))
            scores = []
            for c in c_grid:
                err = 0.0
                for (case, *_), (zz, lo, v18) in zip(rows, sims):
                    m_low, m_zz = measured_deltas(case)
                    t = run_time(zz, c)
                    for m, model in ((m_low, t - run_time(lo, c)), (m_zz, run_time(v18, c) - t)):
                        err += ((m - model) / (NOISE * t)) ** 2
                scores.append(math.sqrt(err / (2 * len(rows))))
            k = int(np.argmin(scores))
            c = float(c_grid[k])
            cells = []
            for (case, *_), (zz, lo, v18) in zip(rows, sims):
                m_low, m_zz = measured_deltas(case)
                t = run_time(zz, c)
                cells.append(f"{m_low:4.0f}/{t - run_time(lo, c):4.0f} {m_zz:4.0f}/{run_time(v18, c) - t:4.0f}")
            print(f"{cap:6d} {sides:5d} {c:5.2f} {scores[k]:8.2f}  " + "  ".join(cells), flush=True)
            if best is None or scores[k] < best[0]:
                best = (scores[k], cap, sides, c)
    print(f"best: L2 {best[1]} MiB, sides {best[2]}, c {best[3]:.2f} us a missed 64 KiB block, rms {best[0]:.2f} "
          f"noise sd", flush=True)
    return best


def compare(cap, sides, c, which=None):
    """Each order's modelled time, DRAM KiB per block and busiest / mean, per row, against zigzag G2."""
    for case in cases():
        index, count = selection(case)
        progs = orders(case, count, which)
        ref = None
        print(f"{case.name} (L2 {cap} MiB, sides {sides}, c {c:.2f} us):", flush=True)
        for name, programs in progs.items():
            st = simulate(programs, index, count, cap, c, sides)
            t = run_time(st, c)
            load = st[:, 0] * B_US + st[:, 1] * A_US
            ref = t if name == "zigzag G2" else ref
            kib = 64 * st[:, 2].sum() / st[:, 0].sum()
            print(f"  {name:14s} {t:8.1f} us  DRAM {kib:5.1f} KiB/block  busiest/mean (no L2) "
                  f"{load.max() / load.mean():.3f}" + (f"  zigzag G2 / it {ref / t:.3f}" if ref else ""), flush=True)


def predict(candidate="streams alt G2", caps=(25, 40, 50)):
    """The candidate's saving over zigzag G2 per row, from what the H200 measured rather than from a fitted miss
    cost (the fit above does not hold: see bench/NOTES.md): (1) its L2 part = lowsel's measured saving x (the
    modelled K/V misses the candidate removes / those lowsel removes), per row and L2 size (lowsel: the same items,
    the locality of the dense walk); (2) its balance part = kappa x the no-L2 model's busiest-program difference,
    kappa = measured / modelled saving of zigzag G2 over the v18 default on the unmasked rows (where the orders
    differ in balance, not in L2 traffic: the list is sequence-major there either way)."""
    rows = []
    for case in cases():
        index, count = selection(case)
        progs = orders(case, count, ("zigzag G2", "v18 default", candidate))
        rows.append((case, index, count, progs))
    kappas = []
    for case, index, count, progs in rows:
        if not case.causal:
            zz, v18 = (simulate(progs[k], index, count, 1e6) for k in ("zigzag G2", "v18 default"))
            kappas.append(measured_deltas(case)[1] / (run_time(v18, 0) - run_time(zz, 0)))
    kappa = float(np.mean(kappas))
    print(f"kappa (measured / modelled balance saving, unmasked rows): {' '.join(f'{k:.2f}' for k in kappas)} -> "
          f"{kappa:.2f}", flush=True)
    for case, index, count, progs in rows:
        lowsel, _ = measured_deltas(case)
        d, low = ABLATION[row_key(case)]
        zz, cand = (simulate(progs[k], index, count, 1e6) for k in ("zigzag G2", candidate))
        balance = kappa * (run_time(zz, 0) - run_time(cand, 0))
        cells = []
        for cap in caps:
            m_zz, m_low, m_cand = (simulate(p, i, count, cap)[:, 2].sum() / SMS for p, i in (
                (progs["zigzag G2"], index), (progs["zigzag G2"], lowest(index, count)), (progs[candidate], index)))
            ratio = (m_zz - m_cand) / (m_zz - m_low) if m_zz - m_low > 1 else float("nan")
            l2 = ratio * lowsel if case.causal else 0.0  # unmasked: no lowsel saving measured (the A/A's noise)
            cells.append(f"{cap} MiB: misses {m_zz:5.1f} / lowsel {m_low:5.1f} / cand {m_cand:5.1f}, ratio "
                         f"{ratio:4.2f}, saving {l2 + balance:5.0f} us ({d * 1e3 / (d * 1e3 - l2 - balance):.3f}x)")
        print(f"{row_key(case)} (lowsel measured {lowsel:.0f} us; balance part {balance:.0f} us):\n    "
              + "\n    ".join(cells), flush=True)


def queue_run(programs, index, count, cap_mib=40, bw_tbs=3.0, latency_us=0.8, depth=2, b_us=B_US, a_us=A_US):
    """(busiest program's us, K/V misses per SM) with DRAM as one FIFO server instead of a cost per miss: a block
    missed in the L2 (``simulate``'s LRU) takes 64 KiB / ``bw_tbs`` of the server (a Q tile 32 KiB) and lands
    ``latency_us`` after; a block read again while its fill is in flight waits for that fill; the producer issues a
    block's load when its ring slot frees (``depth`` blocks ahead, the kernel's NUM_BUFFERS_KV at D128); the consumer
    starts a block at the later of its clock and the block's arrival. Misses cost only where the queue backs up past
    the ring's lead."""
    us_per_kib = 1024 / (bw_tbs * 1e6)
    cap = cap_mib * 1024 / 64
    cache, used, pending, dram_free = OrderedDict(), [0.0], {}, [0.0]

    def access(key, units, t):
        if key in cache:
            cache.move_to_end(key)
            arrival = pending.get(key)
            return (arrival if arrival is not None and arrival > t else t), False
        dram_free[0] = max(t, dram_free[0]) + 64 * units * us_per_kib
        pending[key] = dram_free[0] + latency_us
        cache[key] = units
        used[0] += units
        while used[0] > cap:
            old, u = cache.popitem(last=False)
            used[0] -= u
            pending.pop(old, None)
        return pending[key], True

    walks = [[index[s, h, i, :count[s, h, i]] for s, h, i in mine] for mine in programs]
    flat = [[(it, j) for it, w in enumerate(ws) for j in range(len(w))] for ws in walks]
    clock, starts, finish, misses = [0.0] * SMS, [[] for _ in range(SMS)], np.zeros(SMS), 0
    heap = [(0.0, p, 0) for p in range(SMS) if flat[p]]
    heapq.heapify(heap)
    while heap:
        issued, p, k = heapq.heappop(heap)
        it, j = flat[p][k]
        s, h, i = programs[p][it]
        if j == 0:
            access(("q", s, h, i), ITEM_UNITS, issued)
        ready, missed = access((s, h, int(walks[p][it][j])), 1.0, issued)
        misses += missed
        start = max(clock[p] + (a_us if j == 0 else 0.0), ready)
        clock[p] = start + b_us
        starts[p].append(start)
        if k + 1 < len(flat[p]):
            freed = starts[p][k + 1 - depth] + b_us if k + 1 >= depth else 0.0
            heapq.heappush(heap, (max(freed, issued), p, k + 1))
        else:
            finish[p] = clock[p]
    return float(finish.max()), misses / SMS


def queue_table(caps=(25, 40), bandwidths=(2.0, 2.5, 3.0)):
    """Measured / modelled saving (us) of lowsel and of zigzag G2 over the v18 default, and the candidate's, under
    ``queue_run``."""
    rows = []
    for case in cases():
        index, count = selection(case)
        rows.append((case, index, count, lowest(index, count),
                     orders(case, count, ("zigzag G2", "v18 default", "streams alt G2"))))
    for cap in caps:
        for bw in bandwidths:
            cells = []
            for case, index, count, low, progs in rows:
                zz, lo, v18, cand = (queue_run(progs[o], i, count, cap, bw)[0] for o, i in (
                    ("zigzag G2", index), ("zigzag G2", low), ("v18 default", index), ("streams alt G2", index)))
                m_low, m_zz = measured_deltas(case)
                cells.append(f"{m_low:4.0f}/{zz - lo:4.0f} {m_zz:4.0f}/{v18 - zz:5.0f} streams {zz - cand:4.0f}")
            print(f"{cap} MiB {bw} TB/s | " + " | ".join(cells), flush=True)


def tlb(programs, index, count, lens, entries, per_sm=True, rows_per_page=512):
    """Page misses per SM of an LRU TLB of ``entries`` 2 MiB pages, one per program (``per_sm``) or one for the GPU:
    a K/V block's page is its first row's (K and V rows are [T, H, D] bf16 H16 D128: 4 KiB, 512 rows a page, every
    head of a row in it), one block per 1.84 us and 3.70 per item as ``simulate``'s programs."""
    off = np.concatenate([[0], np.cumsum(lens)])
    caches = [OrderedDict() for _ in range(SMS if per_sm else 1)]
    misses = 0
    walks = [[index[s, h, i, :count[s, h, i]] for s, h, i in mine] for mine in programs]
    heap = [(0.0, p, 0, 0) for p in range(SMS) if programs[p]]
    heapq.heapify(heap)
    while heap:
        clock, p, it, j = heapq.heappop(heap)
        s = programs[p][it][0]
        walk = walks[p][it]
        if len(walk):
            page = (off[s] + int(walk[j]) * BLOCK) // rows_per_page
            misses += fsm.lru_miss(caches[p if per_sm else 0], page, entries)
        clock += B_US + (A_US if j == 0 else 0.0)
        if j + 1 < len(walk):
            heapq.heappush(heap, (clock, p, it, j + 1))
        elif it + 1 < len(programs[p]):
            heapq.heappush(heap, (clock, p, it + 1, 0))
    return misses / SMS


def tlb_table():
    """Per row: TLB misses per SM of zigzag G2 / lowsel / streams alt G2, per-SM TLBs of 8-32 pages and GPU-wide
    ones of 64-128 (the check that a TLB's reach, not the L2, is not what lowsel's causal saving follows)."""
    for case in cases():
        index, count = selection(case)
        low = lowest(index, count)
        progs = orders(case, count, ("zigzag G2", "streams alt G2"))
        cells = []
        for per_sm, entries in ((True, 8), (True, 16), (True, 32), (False, 64), (False, 128)):
            got = [tlb(p, i, count, case.kv_lens, entries, per_sm) for p, i in (
                (progs["zigzag G2"], index), (progs["zigzag G2"], low), (progs["streams alt G2"], index))]
            cells.append(f"{'SM' if per_sm else 'GPU'} {entries}: " + " / ".join(f"{g:.0f}" for g in got))
        print(f"{row_key(case):16s} " + " | ".join(cells), flush=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    best = (None, 25, 1, 1.0)
    if "--fit" in argv:
        best = fit()
    if "--orders" in argv:
        compare(best[1], best[2], best[3])
    if "--predict" in argv:
        predict()
    if "--tlb" in argv:
        tlb_table()
    if "--queue" in argv:
        queue_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
