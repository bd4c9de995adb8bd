"""CPU model of the TLX dense backward's schedule on GQA (helper gqabwd, bench/NOTES.md "TLX GQA backward balance"):
the bench's "GQA 16:2, jagged T=32768, causal" row against the MHA jagged causal rows.

A work item is (key tile of 128 keys, kv head) and walks, for every q head of the kv head's group, the 64-row query
blocks its keys see (``attn_bwd``: ``for g in range(g_begin, g_end)``), so GQA has group-times fewer, longer items.
Per item: blocks = heads x visible query blocks (causal: ceil(L / 64) - 2 j for key tile j), the two diagonal blocks
per head at ``MASKED_COST``, plus ``PER_ITEM`` blocks of fixed cost (K/V load, epilogue). The list is
``scheduling.kv_tiles``' (longest first, stable; ``bwd_causal_model.tile_list``), the items tile-major (the kernel's
``work_item``: tile = w // units, unit = w % units; with GROUP_SPLIT a unit is kv head x part), taken by static
striding (program p: p, p + 132, ...) or the snake (ITEM_ORDER). Reported: items per SM, the longest item, the mean
per SM, the busiest program (the makespan in block units) over the mean, LPT's bound, and a TFLOP/s prediction
calibrated on the MHA T32768 causal row of the same batch (tlx_check backward-timing, H200: 417.5 TF/s). ``--l2``
adds ``sparse_bwd_model.l2_model``'s DRAM KiB per block (LRU over 32 KiB Q+dO / fp32 dQ records, 50 MB; ~1-2 min per
order). ``python tools/gqa_bwd_model.py [--l2]`` (~2 s; --l2 ~1 min; with TLX on the path, e.g.
``PYTHONPATH=/work/venv-tlx/lib/python3.11/site-packages:.``, it also prints ``configs.gqa_split_parts``' choice).

``--rule`` (helper gqarule, bench/NOTES.md "GQA split rule"): for a spread of GQA shapes the tlx backend takes
(dense and jagged, causal and not, D64, a 4096-row call, broadcast Q, a window), every program's load simulated on
the real lengths (``jfa_ops.backends.gqa_split``'s cost model: full, causal and window visibility, the split's
costs: fp32 dK/dV buffer bytes, the longer path, three launches) for the default (striding), the snake alone and
each part count, beside what ``gqa_split.plan`` (shapes only) and the old rule (``JFA_TLX_BWD_GQA_SPLIT=16``) take.

``--plan-cost`` (helper gqaplan, bench/NOTES.md "plan cost"): host microseconds of ``gqa_split.plan`` per call with
T changing every call, the simulation forced on every call (the memo cleared: what a new shape cost before) against
the memo on the stand-in's rounded lengths; and over packed training streams (the bench's lognormal lengths, 3,000
batches of T32768 / T65536: batch size and longest sequence new each step). ~1 min on one core.
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools.bwd_causal_model import FIXED_S_PER_ROW_D128, MASKED_COST, tile_list  # noqa: E402
from tools.sparse_bwd_model import PER_ITEM, SMS, l2_model, lpt, per_program  # noqa: E402

HEAD_DIM, BLOCK_M, BLOCK_N = 128, 64, 128
SPLIT_ITEM = 0.5  # a split item's extra fixed cost in blocks: 2 x 64 fp32 red per thread + the dK/dV re-read
CALIBRATION = ("MHA 16:16 T32768", 417.5)  # tlx_check backward-timing default, H200 2026-12-02 (bench/NOTES.md v16)
MEASURED = {"GQA 16:2 T32768": 310.2, "MHA 16:16 T16384": 423.4, "MHA 16:16 T65536": 350.4,
            "MHA 16:16 T32768": 417.5}  # bench 2026-12-02 17:43 (T32768 MHA: tlx_check), default TLX backward


def cases():
    """(name, lengths, q heads, kv heads): the bench's GQA row and MHA jagged causal rows (bench.suites, quick),
    tlx_check's MHA T32768 row (the GQA row's batch) and issue 10's GQA 32:4 on it."""
    from bench.suites import JAGGED_SEED, lognormal_lengths

    lens = {t: lognormal_lengths(t, None, seed=JAGGED_SEED) for t in (16384, 32768, 65536)}
    return [("GQA 16:2 T32768", lens[32768], 16, 2), ("MHA 16:16 T32768", lens[32768], 16, 16),
            ("MHA 16:16 T16384", lens[16384], 16, 16), ("MHA 16:16 T65536", lens[65536], 16, 16),
            ("GQA 32:4 T32768", lens[32768], 32, 4)]


def items(lens, heads_q, heads_kv, parts=1):
    """The kernel's work list: per item (tile index, kv head, first q head, end, cost in blocks), tile-major."""
    group = heads_q // heads_kv
    per = group // parts
    out = []
    for t, (_, _, _, blocks) in enumerate(tile_list(lens, True)):
        for unit in range(heads_kv * parts):
            kv, first = unit // parts, (unit % parts) * per
            cost = per * (blocks + (MASKED_COST - 1) * min(2, blocks)) + PER_ITEM + (SPLIT_ITEM if parts > 1 else 0)
            out.append((t, kv, first, first + per, cost))
    return out


def walks(lens, work, group):
    """Each item's (head, (seq, query block)) walk, in the kernel's order (the L2 model's input)."""
    tiles = tile_list(lens, True)
    out = []
    for t, kv, first, end, _ in work:
        seq, j, length, _ = tiles[t]
        out.append([(kv * group + g, (seq, q)) for g in range(first, end) for q in range(2 * j, -(-length // BLOCK_M))])
    return out


def schedule(work, snake):
    """(busiest program's cost, mean per program) in blocks."""
    load = [sum(w[4] for w in mine) for mine in per_program(work, snake)]
    return max(load), float(np.mean(load))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from jfa_ops.backends.triton.scheduling import capacity_of

    try:  # the rule itself (TLX must import: its package raises without it)
        import _utlx_autoregister  # noqa: F401

        from jfa_ops.backends.tlx.configs import gqa_split_parts
    except ImportError:
        gqa_split_parts = None

    rows = {}
    for name, lens, hq, hkv in cases():
        group = hq // hkv
        slots = capacity_of(sum(lens), BLOCK_N, len(lens))
        rule = gqa_split_parts(group, slots * hkv, SMS, 16) if gqa_split_parts else "(TLX not importable: ?)"
        print(f"{name}: {len(lens)} sequences, longest {max(lens)}; {slots} key tile slots x {hkv} kv heads "
              f"(group {group}); GQA_SPLIT=16 takes {rule} parts", flush=True)
        for parts in [d for d in range(1, group + 1) if group % d == 0]:
            work = items(lens, hq, hkv, parts)
            costs = [w[4] for w in work]
            for snake in (False, True):
                busiest, mean = schedule(work, snake)
                rows[(name, parts, snake)] = busiest
                line = (f"  parts {parts} {'snake ' if snake else 'stride'}: items {len(work)} ({len(work) / SMS:.1f} "
                        f"per SM), longest {max(costs):.0f}, mean/SM {mean:.0f}, busiest {busiest:.0f} "
                        f"({busiest / mean:.3f} of the mean), LPT {lpt(costs):.3f}")
                if "--l2" in argv and parts in (1, rule) and (snake or parts == 1):
                    kib, mib, hs = l2_model([walks(lens, mine, group) for mine in per_program(work, snake)])
                    line += f"; DRAM {kib:.1f} KiB/block, in flight {mib:.0f} MiB of rows, {hs:.1f} heads"
                print(line, flush=True)
    # Prediction: time = busiest x t_block + the delta / finalize passes (+ the split's zero / cast of dK/dV in fp32),
    # t_block from the calibration row (the same batch, MHA), FLOPs from bench.flops
    from bench.flops import attention_flops, visible_pairs

    def seconds(name, lens, hkv, parts, snake, t_block):
        # the split's fp32 dK/dV buffer (2 x T x Hkv x D x 4 B): zeroed, its lines read and written back around the
        # red adds, read and cast (half) after: ~4.5 x its bytes of DRAM at 3.4 TB/s
        extra = 0.0 if parts == 1 else 4.5 * 2 * sum(lens) * hkv * HEAD_DIM * 4 / 3.4e12
        return rows[(name, parts, snake)] * t_block + FIXED_S_PER_ROW_D128 * sum(lens) + extra

    by_name = {c[0]: c for c in cases()}
    cname, ctf = CALIBRATION
    _, clens, chq, _ = by_name[cname]
    cflops = attention_flops(visible_pairs(clens, clens, True), chq, HEAD_DIM, "bwd")
    t_block = (cflops / (ctf * 1e12) - FIXED_S_PER_ROW_D128 * sum(clens)) / rows[(cname, 1, False)]
    print(f"\ncalibration: {cname} at {ctf} TF/s -> {t_block * 1e6:.2f} us per block-unit (busiest program)")
    for name, lens, hq, hkv in cases():
        flops = attention_flops(visible_pairs(lens, lens, True), hq, HEAD_DIM, "bwd")
        group = hq // hkv
        preds = []
        for parts in [d for d in range(1, group + 1) if group % d == 0]:
            for snake in (False, True):
                tf = flops / seconds(name, lens, hkv, parts, snake, t_block) / 1e12
                preds.append(f"{parts}{'s' if snake else ''} {tf:.0f}")
        print(f"{name}: measured {MEASURED.get(name, float('nan'))}; model TF/s by parts (s: snake): "
              + ", ".join(preds), flush=True)
    return 0


def rule_cases():
    """(name, q lens, kv lens, Hq, Hkv, D, causal, window, broadcast_q, what the default backward runs): the shapes
    to decide JFA_TLX_BWD_GQA_SPLIT=auto on. ``default``: "tile" (the dense tile list, where the split applies) or
    "causal order" (a one-length causal batch at D >= 128 takes CAUSAL_ORDER's list: no split, the row a control)."""
    from bench.suites import JAGGED_SEED, lognormal_lengths

    jag = lognormal_lengths(32768, None, seed=JAGGED_SEED)
    small = lognormal_lengths(4096, None, seed=JAGGED_SEED, max_len=2048)  # 4096 rows: the tlx backend's least
    bq_kv = lognormal_lengths(None, 512, seed=512)
    return [("dense B8 S4096 16:2", (4096,) * 8, (4096,) * 8, 16, 2, 128, False, None, False),
            ("dense B8 S4096 16:2 causal", (4096,) * 8, (4096,) * 8, 16, 2, 128, True, None, False),
            ("dense B4 S8192 32:8", (8192,) * 4, (8192,) * 4, 32, 8, 128, False, None, False),
            ("jagged T32768 16:2", jag, jag, 16, 2, 128, False, None, False),
            ("jagged T32768 16:2 causal", jag, jag, 16, 2, 128, True, None, False),
            ("jagged T32768 32:4", jag, jag, 32, 4, 128, False, None, False),
            ("jagged T32768 32:4 causal", jag, jag, 32, 4, 128, True, None, False),
            ("jagged T32768 16:2 D64 causal", jag, jag, 16, 2, 64, True, None, False),
            ("dense B8 S4096 16:2 D64 causal", (4096,) * 8, (4096,) * 8, 16, 2, 64, True, None, False),
            ("jagged T4096 16:2 causal", small, small, 16, 2, 128, True, None, False),
            ("dense B1 S4096 16:2 causal", (4096,), (4096,), 16, 2, 128, True, None, False),
            ("broadcast-Q Lq128 B512 8:2", (128,) * 512, bq_kv, 8, 2, 128, False, None, True),
            ("jagged T32768 16:2 window(512,0)", jag, jag, 16, 2, 128, True, (512, 0), False)]


def rule_table() -> int:
    """Predicted TFLOP/s of each plan on the real lengths, and the plans the rules pick (see the module doc)."""
    from bench.flops import attention_flops, visible_pairs
    from jfa_ops.backends import gqa_split as gs
    from jfa_ops.backends.triton.common import window_bounds
    from jfa_ops.backends.triton.scheduling import capacity_of

    def old_rule(group, items, rounds=16):  # configs.gqa_split_parts (needs no TLX here)
        if group <= 1:
            return 1
        return next((d for d in range(1, group + 1) if group % d == 0 and items * d >= rounds * SMS), group)

    print("GQA split: predicted TFLOP/s on the real lengths (s: the snake; every program simulated), the plan "
          "gqa_split.plan takes from shapes (its own predicted gain on its stand-in batch), the old rule's parts")
    for name, ql, kl, hq, hkv, d, causal, window, bq in rule_cases():
        group = hq // hkv
        wl, wr = window if window else (-1, -1)
        bounds = window_bounds(causal, wl, wr)
        one_length = len(set(kl)) == 1 and (bq or len(set(ql)) == 1)
        if causal and not bq and window is None and one_length and d >= 128:
            default = "causal order (no split)"
        else:
            default = "tile list"
        if bq:
            runs = [gs.tile_runs([(n, 1)], bounds, broadcast_rows=ql[0]) for n in kl]
            rows_q = ql[0]
        else:
            runs = [gs.tile_runs([(n, 1)], bounds, q_per_kv=a / max(n, 1)) for a, n in zip(ql, kl)]
            rows_q = sum(ql)
        merged = {}
        for r in runs:
            for b, m, c in r:
                merged[(b, m)] = merged.get((b, m), 0) + c
        tiles = sorted(((b, m) for (b, m), c in merged.items() for _ in range(c)),
                       key=lambda t: -(t[0] + (gs.MASKED - 1) * t[1]))
        t_block = gs.BLOCK_S.get(d)
        fixed = gs.FIXED_S_PER_ROW * rows_q * d / 128
        buf = 2 * sum(kl) * hkv * d * 4
        flops = attention_flops(visible_pairs(ql, kl, causal, window or (-1, -1)), hq, d, "bwd")

        def exact(parts, snake):
            per = group // parts
            work = [per * (b + (gs.MASKED - 1) * m) + gs.PER_ITEM + (gs.PER_PART if parts > 1 else 0)
                    for b, m in tiles for _ in range(hkv * parts)]
            load = [sum(w[4] for w in mine) for mine in per_program([(0, 0, 0, 0, c) for c in work], snake)]
            t = max(load) * t_block + fixed
            if parts > 1:
                t += (gs.SPLIT_PATH - 1) * (t - fixed) + gs.SPLIT_DRAM * buf / gs.HBM + gs.SPLIT_LAUNCHES_S
            return t, max(load) / float(np.mean(load))

        base, imb = exact(1, False)
        cols = [f"default {flops / base / 1e12:.0f} ({imb:.2f})"]
        for parts in gs.divisors(group):
            t, imb = exact(parts, True)
            cols.append(f"{parts}s {flops / t / 1e12:.0f} ({base / t:.2f}x, {imb:.2f})")
        slots = capacity_of(sum(kl), BLOCK_N, len(kl))
        rows_kv = sum(kl)
        chosen = gs.plan(group, hkv, len(kl), rows_q, rows_kv, max(kl), d, bounds, bq, SMS)
        old = old_rule(group, slots * hkv)
        real = base / exact(chosen.parts, chosen.snake)[0]
        print(f"{name} [{default}; items {len(tiles) * hkv} real, {slots * hkv} slots, "
              f"{len(tiles) * hkv / SMS:.1f}/SM]:\n    " + ", ".join(cols)
              + f"\n    auto: parts {chosen.parts}{' snake' if chosen.snake else ''} (its model {chosen.gain:.2f}x, "
              f"real lengths {real:.2f}x); old rule (16 rounds): parts {old} ({base / exact(old, old > 1)[0]:.2f}x)",
              flush=True)
    return 0


def plan_cost() -> int:
    """Host us per ``gqa_split.plan`` call (see the module doc)."""
    import random
    import time

    from bench.suites import lognormal_lengths
    from jfa_ops.backends import gqa_split as gs

    causal, full = (False, 0, True, 0), (False, 0, False, 0)

    def per_call(calls, simulate: bool = False, fresh: bool = False) -> float:  # CPU time: the machine is shared
        start = time.process_time()
        for args in calls:
            if fresh:
                gs._makespans.cache_clear()
            gs.plan(*args, simulate=simulate)
        return (time.process_time() - start) / len(calls) * 1e6

    rng = random.Random(0)
    print("host us per plan call: the simulation of every round (gqarule / gqaplan's model; each call new), the "
          "fluid model with the memo cleared (each call a new stand-in), memoized (T +-200 rows)")
    for name, (group, hkv, seqs, rows, hint, bounds) in {
            "16:2 causal B27 longest 8192 T32768 (bench)": (8, 2, 27, 32768, 8192, causal),
            "16:2 B27 T32768": (8, 2, 27, 32768, 8192, full), "32:4 causal B27 T32768": (8, 4, 27, 32768, 8192, causal),
            "16:2 causal B63 T65536": (8, 2, 63, 65536, 8192, causal),
            "16:2 causal B300 longest 16384 T262144": (8, 2, 300, 262144, 16384, causal),
            "16:2 causal B27 T32768, no hint": (8, 2, 27, 32768, -1, causal),
            "16:2 window(512,0) B27 T32768": (8, 2, 27, 32768, 8192, (True, 512, True, 0)),
            "16:2 causal B8 S4096 (one length)": (8, 2, 8, 32768, 4096, causal),
            "16:2 causal B7 longest 2048 T4096 (small: the step path)": (8, 2, 7, 4096, 2048, causal),
            "16:2 causal B1 S4096 (one wave)": (8, 2, 1, 4096, 4096, causal)}.items():
        drift = [(group, hkv, seqs, rows + d, rows + d, hint, 128, bounds, False, SMS)
                 for d in (rng.randint(-200, 200) for _ in range(400))]
        simulated, fresh = per_call(drift, simulate=True), per_call(drift, fresh=True)
        gs._makespans.cache_clear()
        print(f"{name}: simulated {simulated:.0f} us, fluid {fresh:.0f} us, memoized {per_call(drift):.1f} us",
              flush=True)
    for rows in (32768, 65536):
        steps = [(8, 2, len(lens), rows, rows, max(lens), 128, causal, False, SMS)
                 for lens in (lognormal_lengths(rows, None, seed=seed) for seed in range(3000))]
        simulated = per_call(steps[:500], simulate=True)
        gs._makespans.cache_clear()
        first = per_call(steps)
        misses = gs._makespans.cache_info().misses
        print(f"packed T{rows} 16:2 causal, 3000 lognormal batches: simulated {simulated:.0f} us, fluid memoized "
              f"{first:.0f} us ({misses} new stand-ins), the last 500 again {per_call(steps[-500:]):.1f} us",
              flush=True)
    return 0


def plan_agreement() -> int:
    """The fluid plan against the simulation's (``--plan-agree``, ~1 min): tests/backends/test_gqa_split.py's random
    shapes (20 seeds x 100), 1,500 small calls (256-20,000 rows, 1-24 sequences) and packed training batches (300
    lognormal per T32768 / T65536, four head shapes), 132 and 78 SMs; where the picks differ, the simulation's loss
    of the fluid pick against its own pick and its gain over the default."""
    import random

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "backends"))
    from bench.suites import lognormal_lengths
    from test_gqa_split import PLANS, fluid_against_simulation, shape_grid

    causal = (False, 0, True, 0)
    grid = [args for seed in range(20) for args in shape_grid(seed, 100)] + [a for _, a, _ in PLANS]
    rng = random.Random(5)  # small calls (few rounds, few tile costs: the step path), as the tlx backend may take
    small = [(rng.choice([2, 4, 8, 16]), rng.choice([1, 2, 4, 8]), seqs, rows, rows,
              rng.choice([-1, rng.randint(rows // seqs, rows), 2048, 4096]), 128,
              rng.choice([causal, (False, 0, False, 0), (True, 256, True, 0)]), False)
             for rows, seqs in ((rng.randint(256, 20000), rng.randint(1, 24)) for _ in range(1500))]
    streams = [(g, hkv, len(lens), rows, rows, max(lens), 128, causal, False)
               for rows in (32768, 65536) for lens in (lognormal_lengths(rows, None, seed=s) for s in range(300))
               for g, hkv in ((8, 2), (8, 4), (4, 2), (16, 1))]
    for name, shapes in (("random shapes", grid), ("small calls", small), ("packed training batches", streams)):
        for programs in (SMS, 78):
            differ, compared = fluid_against_simulation(shapes, (programs,))
            losses = sorted(loss for loss, _ in differ)
            print(f"{name}, {programs} SMs: {compared} plans, {len(differ)} differ ({len(differ) / compared:.1%}); "
                  f"simulated loss of the fluid pick: > 1% {sum(x > 0.01 for x in losses)}, > 2% "
                  f"{sum(x > 0.02 for x in losses)}, max {max(losses, default=0):.1%}; fluid splits the simulation "
                  f"rates < 1.0x: {sum(g < 1.0 for _, g in differ)} (min {min((g for _, g in differ), default=1):.3f})",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(rule_table() if "--rule" in sys.argv else plan_cost() if "--plan-cost" in sys.argv
             else plan_agreement() if "--plan-agree" in sys.argv else main())
