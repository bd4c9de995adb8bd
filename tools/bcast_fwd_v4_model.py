"""CPU model of the broadcast-Q forward on the v4 consumers with STORE_TMA (helper bcastfwd41, bench/NOTES.md
"Broadcast-Q forward on v4: where the bytes and the time go, helper bcastfwd41, stop 41"): the bench's headline
broadcast row (``bench.suites.broadcast_cases``: Lq 128 shared by B 512 sequences, H4, D128, bf16, KV lognormal seed
512), issue 10's 1.5x-FA4 target.

1. counts: items, blocks per item, HBM bytes per item (K/V, Q, out, lse), the floors (useful and as moved: whole
   128-key blocks);
2. the fit: t = moved bytes / BW + items per SM x c + a (a: the tile list's kernels and the pipeline's fill and
   drain), c from stop 40's two v4 + STORE_TMA readings (402.9 and 391.0 TFLOP/s), and what c is of the gap to
   1.3x / 1.5x FA4 (FA4 332.5, v22); the same c under bcast31's fluid model (``tools/bcast_fwd_model.py``: SMs that
   finish early hand their HBM share to the others, up to the consumers' rate);
3. shared memory of the v4 kernel and what a third K/V stage needs;
4. the levers: each one's bound under the fitted model.

``python tools/bcast_fwd_v4_model.py`` (~15 s: the fluid fits).
"""
from __future__ import annotations

import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import bcast_fwd_model as bfm  # noqa: E402

SMS, BLOCK = bfm.SMS, bfm.BLOCK
HBM_TBS = bfm.HBM_TBS  # device copy (read + write), bench/NOTES.md's floor table
FA4_TFLOPS = 332.5  # v22 bench (bench_2026-12-03_210640_h200), the same row
V4_TMA_TFLOPS = (402.9, 391.0)  # stop 40 store-timing: storetma, storetma' (bench/results/tlx_check_2026-12-05_stop40_h200)
DENSE_V4_TFLOPS = 597.2  # the same run's dense B8 S4096 D128 with STORE_TMA: 32 blocks an item, K/V mostly from L2
FIXED_US = (5.0, 12.0)  # a: the tile list's kernels (sort by cost: two small launches) + the first loads' latency +
# the last epilogue; not measured alone (bcast31 assumed 10 us for the list)
SMEM_LIMIT = 232_448  # sm_90 opt-in shared memory per block (227 KiB)
SMEM_V4_TMA = 197_256  # ptxas/triton metadata of fwd-d128-bf16-full-bcast-oneloop-storetma-zigzag (this stop, sm_90)


def counts():
    case, kv = bfm.case_lengths()
    heads, d, lq = case.num_heads_q, case.head_dim, 128
    blocks = -(-kv // BLOCK)
    items = len(kv) * heads
    flops = 4 * lq * int(kv.sum()) * d * heads
    row = d * 2  # one key's K (or V) slice of one head, bytes
    kv_useful = 2 * int(kv.sum()) * heads * row
    kv_moved = 2 * int(blocks.sum()) * BLOCK * heads * row
    out_bytes = len(kv) * heads * lq * (row + 4)  # out + lse
    q_hbm = lq * heads * row  # Q from HBM once (its 32 KiB a head then come from the L2, per item)
    return dict(case=case, kv=kv, blocks=blocks, items=items, flops=flops, heads=heads, row=row,
                kv_useful=kv_useful, kv_moved=kv_moved, out_bytes=out_bytes, q_hbm=q_hbm,
                useful_us=(kv_useful + out_bytes + q_hbm) / HBM_TBS / 1e6,
                moved_us=(kv_moved + out_bytes + q_hbm) / HBM_TBS / 1e6)


def main() -> int:
    c = counts()
    kv, blocks, items, flops = c["kv"], c["blocks"], c["items"], c["flops"]
    per_sm_items, per_sm_blocks = items / SMS, blocks.sum() * c["heads"] / SMS
    print(f"{c['case'].name}: {len(kv)} sequences (KV mean {kv.mean():.0f}, median {np.median(kv):.0f}, max "
          f"{kv.max()}, min {kv.min()}), {items} items (sequence, head) of {blocks.mean():.2f} key blocks mean "
          f"(quartiles {np.percentile(blocks, 25):.0f} / {np.median(blocks):.0f} / {np.percentile(blocks, 75):.0f}, "
          f"{int((blocks == 1).sum())} of 1 block, {int((blocks >= 32).sum())} of >= 32)")
    print(f"  per SM: {per_sm_items:.1f} items, {per_sm_blocks:.1f} blocks")
    print(f"  per item: K+V {2 * blocks.mean() * BLOCK * c['row'] / 1024:.0f} KiB moved (useful "
          f"{2 * kv.mean() * c['row'] / 1024:.0f}), Q 32 KiB from the L2 (HBM once: {c['q_hbm'] / 1024:.0f} KiB in "
          f"all), out {128 * c['row'] / 1024:.0f} KiB + lse 0.5 KiB written")
    print(f"  {flops:.4e} FLOP; useful bytes {(c['kv_useful'] + c['out_bytes'] + c['q_hbm']) / 1e9:.3f} GB -> "
          f"{c['useful_us']:.0f} us ({flops / c['useful_us'] / 1e6:.0f} TFLOP/s roofline at {HBM_TBS} TB/s); moved "
          f"(whole blocks, {c['kv_moved'] / c['kv_useful']:.3f}x the K/V) {(c['kv_moved'] + c['out_bytes'] + c['q_hbm']) / 1e9:.3f}"
          f" GB -> {c['moved_us']:.0f} us ({flops / c['moved_us'] / 1e6:.0f} TFLOP/s)")
    tm = 2 * BLOCK * c["row"] / (HBM_TBS * 1e12 / SMS) * 1e6
    tc = 4 * 128 * BLOCK * 128 / (DENSE_V4_TFLOPS * 1e12 / SMS) * 1e6
    print(f"  per block and SM: HBM share {tm:.2f} us, v4 consumers at the dense rate {tc:.2f} us: slack "
          f"{tm - tc:.2f} us a block = {(tm - tc) * blocks.mean():.2f} us an item of catch-up")
    for target in (1.3, 1.5):
        t_us = flops / (target * FA4_TFLOPS * 1e12) * 1e6
        print(f"  {target}x FA4 = {target * FA4_TFLOPS:.0f} TFLOP/s = {t_us:.0f} us a call: "
              f"{t_us / c['useful_us']:.3f}x the useful floor, {t_us / c['moved_us']:.3f}x the moved floor")

    print("fit, serial: t = moved / BW + a + items per SM x c (every item's bubble costs its SM's HBM share)")
    for measured in V4_TMA_TFLOPS:
        t_us = flops / measured / 1e6
        for a in FIXED_US:
            item_c = (t_us - c["moved_us"] - a) / per_sm_items
            print(f"  {measured} TFLOP/s = {t_us:.1f} us, a {a:.0f} us: c = {item_c:.2f} us an item "
                  f"({item_c * 1.98e3:.0f} clk at 1.98 GHz), {item_c * per_sm_items:.0f} us a SM = "
                  f"{item_c * per_sm_items / t_us:.0%} of the call")
            for target in (1.3, 1.5):
                goal = flops / (target * FA4_TFLOPS * 1e12) * 1e6
                gap = t_us - goal
                print(f"      gap to {target}x FA4: {gap:.0f} us; the per-item term is {item_c * per_sm_items / gap:.0%}"
                      f" of it; with c = 0: {flops / (t_us - item_c * per_sm_items) / 1e6:.0f} TFLOP/s "
                      f"({flops / (t_us - item_c * per_sm_items) / 1e6 / FA4_TFLOPS:.2f}x FA4)")

    print("fit, fluid (bcast31's model: an SM moves no bytes for c us an item, then its blocks at max(Tc, Tm x "
          "active / 132); the default zigzag G2 order; Tm the HBM share at the BW below):")
    orders = bfm.plans(kv, c["heads"])
    default, greedy = next(iter(orders)), "greedy (atomic counter)"
    for measured in V4_TMA_TFLOPS:
        target = flops / measured / 1e6 - 8.0  # a: the middle of FIXED_US
        for bw in (HBM_TBS, 4.0, 3.8):
            tm_bw = 2 * BLOCK * c["row"] / (bw * 1e12 / SMS) * 1e6
            lo, hi = 0.0, 8.0
            if not bfm.fluid(orders[default], tc, tm_bw, lo) <= target <= bfm.fluid(orders[default], tc, tm_bw, hi):
                print(f"  {measured}: BW {bw} TB/s: no c fits (c = 0 gives "
                      f"{bfm.fluid(orders[default], tc, tm_bw, 0.0):.0f} us against {target:.0f})")
                continue
            for _ in range(30):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if bfm.fluid(orders[default], tc, tm_bw, mid) < target else (lo, mid)
            item_c = (lo + hi) / 2
            g = bfm.fluid(orders[greedy], tc, tm_bw, item_c)
            half = bfm.fluid(orders[default], tc, tm_bw, max(item_c - (tm - tc) * blocks.mean(), 0.0))
            print(f"  {measured}: BW {bw} TB/s (Tm {tm_bw:.2f}, Tc {tc:.2f} us a block): c = {item_c:.2f} us an item; "
                  f"greedy order {target / g:.3f}x; the bubble less one item's catch-up "
                  f"({(tm - tc) * blocks.mean():.2f} us: a third K/V stage) {target / half:.3f}x")

    print("levers under the serial fit (us a SM saved of the measured call; ranges over FIXED_US and the two readings):")
    catch_up = (tm - tc) * blocks.mean()  # what the consumers can make up per item once bytes kept streaming
    pad_us = c["moved_us"] - c["useful_us"]
    levers = {  # name: (low, high) us saved per SM
        "third K/V stage, 2 Q slots (does not fit: 262,792 B)": (catch_up * per_sm_items, catch_up * per_sm_items),
        "third K/V stage, 1 Q slot (Q's L2 round trip, 0.5-1.0 us, back on each item's path)":
            ((catch_up - 1.0) * per_sm_items, (catch_up - 0.5) * per_sm_items),
        "value fix-up off consumer 0's path (0.4-0.9 us an item: 2.5 chunks of LDS.U16/STS.U16 + a 256-thread bar)":
            (0.4 * per_sm_items, 0.9 * per_sm_items),
        "last block clipped to the sequence (device-made descriptor: no fix-up, no padded bytes; 60-100% of the "
        "padding's HBM time)": (0.4 * per_sm_items + 0.6 * pad_us, 0.9 * per_sm_items + pad_us),
        "consumers' pipeline across items (item i+1's first QK^T with item i's last PV: 0.7-1.0 us an item)":
            (0.7 * per_sm_items, 1.0 * per_sm_items),
        "producer prefetching the next item's first blocks (it already does: the ring is full, not the producer)":
            (0.0, 0.0),
        "Q resident across items of a head (Q comes from the L2 into the other slot, off the path)": (0.0, 0.0),
    }
    t_lo, t_hi = (flops / m / 1e6 for m in V4_TMA_TFLOPS)
    for name, (lo, hi) in levers.items():
        print(f"  {name}: {lo:.0f}-{hi:.0f} us -> {t_lo / (t_lo - lo):.3f}-{t_hi / (t_hi - hi):.3f}x")

    q_slot = 2 * 64 * 128 * 2
    kv_stage = 2 * BLOCK * 128 * 2
    print(f"shared memory (sm_90, v4 + STORE_TMA): {SMEM_V4_TMA} B of {SMEM_LIMIT} (free {SMEM_LIMIT - SMEM_V4_TMA}):"
          f" Q 2 slots x {q_slot} B, K/V 2 stages x {kv_stage} B, barriers {SMEM_V4_TMA - 2 * q_slot - 2 * kv_stage} B")
    print(f"  a third K/V stage: +{kv_stage} B -> {SMEM_V4_TMA + kv_stage} B (over by "
          f"{SMEM_V4_TMA + kv_stage - SMEM_LIMIT}); with one Q slot: {SMEM_V4_TMA + kv_stage - q_slot} B (fits, "
          f"{SMEM_LIMIT - (SMEM_V4_TMA + kv_stage - q_slot)} B left), but then the next item's Q (and STORE_TMA's "
          f"staging, which uses the Q slot) waits for the previous item's out store: an L2 round trip on every item's path")
    return 0


if __name__ == "__main__":
    sys.exit(main())
