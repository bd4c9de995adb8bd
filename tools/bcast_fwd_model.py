"""CPU model of the TLX forward on the bench's broadcast-Q case (helper bcast31, bench/NOTES.md "Broadcast-Q forward,
helper bcast31, stop 31"): one dense Q of Lq = 128 rows shared by B = 512 sequences, H = 4, D = 128, bf16, jagged K/V
(``bench.suites.broadcast_cases``' headline, lognormal seed 512). Where does the forward lose to the HBM roofline?

1. bytes and FLOPs: useful, and as the kernel moves them (TMA reads whole 128-key blocks, so each item's last block
   runs into the next sequence; it computes them too), the roofline of each;
2. per 128-key block and SM: the consumers' time at the dense TLX rate vs the block's share of HBM time (the case
   sits at the ridge: neither side has slack), and Little's law for the bytes in flight;
3. the tail: each program's blocks (+ a fixed cost per item) under the kernel's orders (the default: zigzag items in
   kv-head groups of ``configs.fwd_head_group``, by the snake; other groups; plain striding) and greedy longest-first
   (an atomic counter: ``configs.FORWARD_DYNAMIC``), from ``tools/fwd_schedule_model.py``;
4. a fluid makespan: each active SM runs a block in max(Tc, Tm x active / 132) us (its compute, or its share of
   HBM when fewer SMs stream), plus ``c`` us per item during which it moves nothing; the (Tc, c) pairs that give the
   measured 334 TFLOP/s for the default order, and what greedy gives with the same pair.

``python tools/bcast_fwd_model.py`` (a few seconds).
"""
from __future__ import annotations

import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import fwd_schedule_model as fsm  # noqa: E402
from bench.suites import broadcast_cases  # noqa: E402

SMS, BLOCK = fsm.SMS, fsm.BLOCK_N
HBM_TBS = 4.27  # device copy, bench/NOTES.md's floor table
DENSE_TLX_TFLOPS = 542.0  # the v3 pipelined consumers on dense B8 S4096 D128 (bench/NOTES.md "TLX forward", run 2)
MEASURED_TFLOPS = 334.0  # the bench's broadcast-Q row, tlx (bench/NOTES.md dashboard, 17:44 table)
LIST_US = 10.0  # the tile list's two small kernels in the same timed call (a guess: a few us each)
LATENCY_US = 0.8  # HBM load latency, unloaded (METHOD.md)


def case_lengths():
    case = broadcast_cases([128], "quick")[0]
    return case, np.array(case.kv_lens)


def plans(kv, heads):
    """Order name -> each program's items (seq, m0, head, blocks): the default (zigzag, the rule's group), other
    groups, plain striding over the tile-major list, greedy (the atomic counter)."""
    blocks = -(-kv // BLOCK)
    order = sorted(range(len(kv)), key=lambda s: -kv[s])  # scheduling.build_tiles: cost 128 x L_k, stable
    tiles = [(s, 0, int(blocks[s])) for s in order]
    n = len(tiles)
    rule = fsm.CONFIGS.fwd_head_group(heads, 1, fsm.capacity([128] * len(kv)), SMS, False, head_group=None)
    out = {f"zigzag G{rule} (default)": fsm.programs_of(tiles, heads, 1, lambda w: fsm.zigzag_item(w, n, heads, 1,
                                                                                                    rule), True)}
    for g in (1, 2, 4):
        if g != rule:
            out[f"zigzag G{g}"] = fsm.programs_of(tiles, heads, 1, lambda w: fsm.zigzag_item(w, n, heads, 1, g), True)
    out["striding, tile-major"] = fsm.programs_of(tiles, heads, 1, lambda w: fsm.work_item(w, n, heads, 1, False),
                                                  False)
    out["greedy (atomic counter)"] = fsm.greedy(tiles, heads, 1)
    return out


def fluid(programs, tc, tm, c):
    """Makespan (us): each program's items in order; an item costs ``c`` us (no bytes moved), then its blocks at
    max(tc, tm x active / SMS) us each (active: programs not yet done)."""
    work = [[b for *_, b in p] for p in programs]
    item = [0] * SMS
    left = [float(w[0]) if w else 0.0 for w in work]
    fixed = [c if w else 0.0 for w in work]
    active = [p for p in range(SMS) if work[p]]
    t = 0.0
    while active:
        per_block = max(tc, tm * len(active) / SMS)
        dt = min(fixed[p] if fixed[p] > 0 else left[p] * per_block for p in active)
        t += dt
        still = []
        for p in active:
            if fixed[p] > 0:
                fixed[p] = max(fixed[p] - dt, 0.0)
            else:
                left[p] -= dt / per_block
            if fixed[p] == 0 and left[p] <= 1e-9:
                item[p] += 1
                if item[p] == len(work[p]):
                    continue
                left[p], fixed[p] = float(work[p][item[p]]), c
            still.append(p)
        active = still
    return t


def main() -> int:
    case, kv = case_lengths()
    heads, d, lq = case.num_heads_q, case.head_dim, 128
    blocks = -(-kv // BLOCK)
    items = len(kv) * heads
    flops = 4 * lq * int(kv.sum()) * d * heads
    kv_bytes = 2 * int(kv.sum()) * heads * d * 2
    kv_bytes_moved = 2 * int(blocks.sum()) * BLOCK * heads * d * 2
    o_bytes = len(kv) * lq * heads * d * 2 + len(kv) * lq * heads * 4  # out + lse
    useful_ms = (kv_bytes + o_bytes) / HBM_TBS / 1e9
    moved_ms = (kv_bytes_moved + o_bytes) / HBM_TBS / 1e9
    print(f"{case.name}: {len(kv)} sequences, KV mean {kv.mean():.0f} (max {kv.max()}), {items} items of "
          f"{blocks.mean():.2f} key blocks mean ({blocks.max()} max, {int((blocks == 1).sum())} of 1), "
          f"{items / SMS:.1f} items and {blocks.sum() * heads / SMS:.1f} blocks per SM")
    print(f"  useful: {flops:.3e} FLOP, {(kv_bytes + o_bytes) / 1e9:.3f} GB -> {useful_ms * 1e3:.0f} us, roofline "
          f"{flops / useful_ms / 1e9:.0f} TFLOP/s")
    print(f"  moved (whole 128-key blocks, {kv_bytes_moved / kv_bytes:.3f}x the K/V bytes): "
          f"{(kv_bytes_moved + o_bytes) / 1e9:.3f} GB -> {moved_ms * 1e3:.0f} us, "
          f"{flops / moved_ms / 1e9:.0f} useful TFLOP/s")
    measured_us = flops / MEASURED_TFLOPS / 1e6
    print(f"  measured {MEASURED_TFLOPS:.0f} TFLOP/s = {measured_us:.0f} us a call ({LIST_US:.0f} of them the tile "
          f"list's kernels, assumed): {moved_ms * 1e3 / measured_us:.0%} of the moved-bytes floor")
    block_flop = 4 * lq * BLOCK * d
    tc = block_flop / (DENSE_TLX_TFLOPS * 1e12 / SMS) * 1e6
    tm = 2 * BLOCK * d * 2 / (HBM_TBS * 1e12 / SMS) * 1e6
    print(f"per 128-key block and SM: compute {tc:.2f} us at the dense TLX rate ({DENSE_TLX_TFLOPS:.0f} TFLOP/s), "
          f"HBM {tm:.2f} us (64 KiB at 1/{SMS} of {HBM_TBS} TB/s): {block_flop / 65536:.0f} FLOP/B against the "
          f"kernel's own ridge {DENSE_TLX_TFLOPS / HBM_TBS:.0f}: both sides saturated, no slack")
    little = HBM_TBS * 1e12 * LATENCY_US * 1e-6 / SMS
    print(f"Little's law: {little / 1024:.0f} KiB in flight per SM at {LATENCY_US} us; the ring holds 2 x 64 KiB, "
          f"~1-1.5 blocks in flight in steady state (K(j+2) waits behind V(j), freed after PV(j) one iteration "
          f"later): {64 / (little / 1024):.1f}-{96 / (little / 1024):.1f}x the need; the next K is issued ~0.75 "
          f"block ({0.75 * tc:.1f} us) before it is needed")
    orders = plans(kv, heads)
    print("tail: busiest SM over the mean (blocks + c blocks per item)")
    for c_blocks in (0.0, 0.5, 1.0):
        row = []
        for name, programs in orders.items():
            load = np.array([sum(b + c_blocks for *_, b in p) for p in programs])
            row.append(f"{name} {load.max() / load.mean():.3f}")
        print(f"  c = {c_blocks} block: " + "; ".join(row))
    default, greedy = next(iter(orders)), "greedy (atomic counter)"
    target = measured_us - LIST_US
    print(f"fluid makespan: for each (Tm, Tc), the per-item c that makes the default order's makespan the measured "
          f"{target:.0f} us (the kernel alone), and greedy's with the same (Tc, Tm, c):")
    # the timing tool's control: every KV length the mean (one cost per item: 15-16 items per SM whatever the order)
    even = int(round(kv.mean()))
    even_programs = [[(0, 0, 0, -(-even // BLOCK))] * (items // SMS + (p < items % SMS)) for p in range(SMS)]
    even_flops = 4 * lq * even * len(kv) * d * heads
    for tm_ in (tm, 2.3, 2.6):
        for tc_ in (1.6, tc, 2.3, 2.45):
            lo, hi = 0.0, 8.0
            if not fluid(orders[default], tc_, tm_, lo) <= target <= fluid(orders[default], tc_, tm_, hi):
                continue
            for _ in range(30):  # bisection: the makespan grows with c
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if fluid(orders[default], tc_, tm_, mid) < target else (lo, mid)
            c = (lo + hi) / 2
            b = fluid(orders[greedy], tc_, tm_, c)
            e = fluid(even_programs, tc_, tm_, c)
            striding = fluid(orders["striding, tile-major"], tc_, tm_, c)
            print(f"  Tm {tm_:.2f} Tc {tc_:.2f} us/block: c {c:.2f} us/item ({c * items / SMS:.0f} us per SM), "
                  f"greedy {b:.0f} us = {flops / (b + LIST_US) / 1e6:.0f} TFLOP/s, "
                  f"{(target + LIST_US) / (b + LIST_US):.3f}x; KV={even} control "
                  f"{even_flops / (e + LIST_US) / 1e6:.0f} TFLOP/s; zigzag over striding "
                  f"{(striding + LIST_US) / (target + LIST_US):.3f}x (measured 1.031: NOTES v16)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
