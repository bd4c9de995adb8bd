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

``--predict`` (helper causalorder2, bench/NOTES.md "TLX causal backward order v2", ~10 s): tlx_check
backward-timing's six rows, time = max(host, GPU) per call (do_bench times back-to-back calls: the longer of the
two). GPU: the busiest program's blocks (+ PER_ITEM per item) x per block max(the loop's compute time, the DRAM
bytes the L2 model gives x SMs / HBM rate) x the masked blocks' extra + the delta / finalize passes. Host: the
default call's (the one unknown, a range) + the per-call list's device ops (counted here) x the H200 host's per-op
time. Also a timeline of each order (makespan with masked blocks at MASKED_COST, and how many programs are on one
(head, query block) at once: the dQ reduce-adds landing together).
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


# --predict's constants (bench/NOTES.md "TLX backward: causal" and "TLX causal backward order v2")
HBM = 3.4e12  # B/s: what the default's DRAM-bound D128 causal rows pull (90-95 KiB per 3.56-3.78 us block x 132)
T_COMPUTE = {128: 2.70e-6, 64: 2.00e-6}  # s per block when not DRAM-bound: D128 the full mask's (S8192 / S2048);
# D64 the measured causal default (2.46 ms, 1,024 blocks / SM at 44.6 KiB: 2.9 TB/s, under HBM: compute-bound)
MASKED_COST = 1.3  # a masked (diagonal) block against a mask-free one
FIXED_S_PER_ROW_D128 = 0.54e-3 / 65536  # delta pre-pass + dQ finalize: 0.54 ms at T65536 D128, streaming
HOST_PER_OP = (9e-6, 15e-6)  # s per small device op on the H200's host (~10 us each; 117 ops: a 1.39 ms call)
HOST_DEFAULT = (0.7e-3, 1.2e-3)  # s per backward call without the list (autograd floor, ~15 launches, 5 TMA
# descriptors, kv_tiles): the unknown; 1.2 = the S2048 causal default's own time (the row at the host floor)
MEASURED = {"B8 H16 S4096 D128": (499.9, 478.7), "B8 H16 S4096 D128 causal": (328.8, 452.1),
            "jagged T32768 D128 causal": (417.5, 433.6), "B8 H16 S4096 D64 causal": (279.3, 273.4),
            "B8 H16 S8192 D128 causal": (365.8, 492.0), "B8 H16 S2048 D128 causal": (284.3, 161.8)}  # TF/s default,
# causal order (H200, 2026-12-02, tlx_check backward-timing)


def list_ops(lens, heads, row_bytes, l2_bytes) -> int:
    """The device ops ``causal_item_list`` runs per call (aten ops through a dispatch counter, CPU tensors)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from jfa_ops.backends.triton.block_sparse_bwd import causal_item_list

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    tiles = tile_list(lens, True)
    schedule = dict(TILE_SEQ=torch.tensor([t[0] for t in tiles], dtype=torch.int32),
                    TILE_START=torch.tensor([t[1] * BLOCK_N for t in tiles], dtype=torch.int32))
    offsets = torch.tensor([0] + list(lens)).cumsum(0).to(torch.int32)
    with Count():
        causal_item_list(schedule, heads, offsets, row_bytes, l2_bytes)
    return Count.n


def timeline(walks):
    """(makespan over the mean, mean and max programs on one (head, query block) within half a block of each
    other): each program runs its items back to back, a block 1 (the first two of a causal item MASKED_COST), an
    item PER_ITEM more."""
    import collections

    visits, ends = collections.defaultdict(list), []
    for mine in walks:
        t = 0.0
        for w in mine:
            for k, block in enumerate(w):
                cost = MASKED_COST if k < 2 else 1.0
                visits[block].append(t + cost / 2)
                t += cost
            t += PER_ITEM
        ends.append(t)
    together = []
    for ts in visits.values():
        ts = np.sort(ts)
        together.extend(np.searchsorted(ts, ts + 0.5) - np.searchsorted(ts, ts - 0.5))
    return max(ends) / np.mean(ends), float(np.mean(together)), int(np.max(together))


def predict() -> int:
    """tlx_check backward-timing's six rows (and the bench's jagged T16384 causal, not measured yet): measured and
    modelled causal order / default, the old rule (every masked call, a per-call list) and the new one (head dim >=
    128; one length: the list made once per shape)."""
    from bench.suites import JAGGED_SEED, lognormal_lengths

    jagged = tuple(lognormal_lengths(32768, None, seed=JAGGED_SEED))
    rows = [("B8 H16 S4096 D128", (4096,) * 8, 128, False), ("B8 H16 S4096 D128 causal", (4096,) * 8, 128, True),
            ("jagged T32768 D128 causal", jagged, 128, True), ("B8 H16 S4096 D64 causal", (4096,) * 8, 64, True),
            ("B8 H16 S8192 D128 causal", (8192,) * 8, 128, True), ("B8 H16 S2048 D128 causal", (2048,) * 8, 128, True),
            ("jagged T16384 D128 causal", tuple(lognormal_lengths(16384, None, seed=JAGGED_SEED)), 128, True)]
    heads = 16
    print("row: GPU ms default / order (busiest SM, DRAM KiB/block, timeline: makespan, programs on one block mean "
          "/ max), list ops; causal/def measured, modelled old rule (host default 0.7-1.2 ms), new rule")
    for name, lens, d, causal in rows:
        tiles = tile_list(lens, causal)
        row_bytes = d * 8  # Q, dO bf16 + fp32 dQ per row of a kv head (one q head each)
        budget_mib = 40 * 128 // d  # the list's 40 MiB in the L2 model's D128-sized records
        plans = orders(tiles, heads, lens, (budget_mib,))
        masked = 2 * len(tiles) * heads / sum(t[3] for t in tiles for _ in range(heads)) if causal else 0.0
        fixed = FIXED_S_PER_ROW_D128 * sum(lens) * d / 128
        gpu = {}
        for key, order in (("default", "tile-major (default)"), ("order", f"causal order {budget_mib} MiB")):
            walks = [[walk(*tiles[t][:3], h, causal) for t, h in items] for items in plans[order]]
            busiest = max(sum(len(w) + PER_ITEM for w in mine) for mine in walks)
            kib, _, _ = l2_model(walks, l2_mb=50 * 128 // d)
            kib = kib * d / 128  # records of the D128 model -> this head dim's bytes
            per_block = max(T_COMPUTE[d], kib * 1024 * SMS / HBM) * (1 + masked * (MASKED_COST - 1))
            span, mean_on, max_on = timeline(walks)
            gpu[key] = (busiest * per_block + fixed, kib, span, mean_on, max_on)
        ops = list_ops(lens, heads, row_bytes, 40 << 20) if causal else 0
        (g0, k0, s0, m0, x0), (g1, k1, s1, m1, x1) = gpu["default"], gpu["order"]
        measured = MEASURED[name][1] / MEASURED[name][0] if name in MEASURED else float("nan")
        old = [max(h, g0) / max(h + ops * per_op + 2 * 10 * per_op, g1) if causal else 1.0  # a sort ~10 ops
               for h in HOST_DEFAULT for per_op in HOST_PER_OP]
        uniform = len(set(lens)) == 1
        takes = causal and d >= 128
        new = [max(h, g0) / max(h + (0 if uniform else ops * per_op + 2 * 10 * per_op), g1 if takes else g0)
               for h in HOST_DEFAULT for per_op in HOST_PER_OP]
        print(f"{name}: GPU {g0 * 1e3:.2f} / {g1 * 1e3:.2f} ms (DRAM {k0:.1f} / {k1:.1f} KiB, makespan {s0:.4f} / "
              f"{s1:.4f}, on one block {m0:.2f} / {m1:.2f}, max {x0} / {x1}), list ops {ops}; measured "
              f"{measured:.2f}, old rule {min(old):.2f}-{max(old):.2f}, new rule {min(new):.2f}-{max(new):.2f}",
              flush=True)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--predict" in argv:
        return predict()
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
