"""Count of issue 10's broadcast-Q backward (helper bcastbwd39; bench/NOTES.md "Issue 10: broadcast-Q backward, helper
bcastbwd39"): the bench's row (one Q of Lq rows shared by B sequences of lognormal KV lengths, H heads, D128 bf16),
its useful FLOPs, HBM bytes, floors, and a per-item model of the TLX backward fitted to one measured time.

    python tools/bcast_bwd_model.py [--tflops 273.9] [--fa4 212.6] [--block-us 2.65] [--passes-us 50] [--fluid]

The model (the forward's fit of helper sparse38 and the window backward's of helper window31 have its form): the
kernel's busiest SM takes blocks x t + items x c, t the dense backward's time per 64-row x 128-key block (2.60-2.70 us
on the H200), c the fixed cost of a work item (key tile, head), solved from the measured call less the delta pre-pass
and the dQ finalize (``--passes-us``: O and dO read once, ~134 MB, plus launches).
"""
from __future__ import annotations

import argparse
import math
import random
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HBM_BPS = 4.27e12  # the H200's measured copy rate (read + write), bench/NOTES.md "The floor"
MMA_FLOPS = 700e12  # bf16 dense matmul, measured 683-800
SMS = 132
BLOCK_M, BLOCK_N = 64, 128  # configs.bwd_config_v2(128, True)


def count(lq=128, heads=4, batch=512, head_dim=128, seed=512):
    from bench.suites import lognormal_lengths

    kv = lognormal_lengths(None, batch, seed=seed)
    pairs = lq * sum(kv)
    flops = 2.5 * 4 * head_dim * pairs * heads
    tiles = sum(math.ceil(n / BLOCK_N) for n in kv)
    items = tiles * heads
    blocks = items * math.ceil(lq / BLOCK_M)
    row = heads * head_dim * 2  # bytes of one bf16 row of K (V, dK, dV alike)
    kv_bytes = 2 * sum(kv) * row  # K and V read once
    dkv_bytes = kv_bytes  # dK and dV written once
    od_bytes = 2 * batch * lq * row  # O and dO read by the delta pre-pass (dO again by the kernel: L2 after its first)
    stats = 2 * batch * lq * heads * 4  # lse, delta
    dq_acc = lq * heads * head_dim * 4  # the fp32 dQ accumulator: L2-resident, reduced into by every item
    return dict(kv=kv, pairs=pairs, flops=flops, tiles=tiles, items=items, blocks=blocks, kv_bytes=kv_bytes,
                dkv_bytes=dkv_bytes, od_bytes=od_bytes, stats=stats, dq_acc=dq_acc,
                dq_reduced=blocks * BLOCK_M * head_dim * 4)


def fluid(items=134, compute_us=5.3, boundary_us=1.5, latency_us=0.8, cap_gbs=100.0, load_kib=64, write_kib=64,
          jitter_us=0.3, jitter_share=0.12, sms=SMS, bw=HBM_BPS, dt_us=0.01, seed=0) -> float:
    """Per-item time (us) of a fluid sketch of today's kernel on this row: each SM loops over its items: the K/V load
    (``load_kib``, issued at the boundary, landing ``latency_us`` + bytes later at an equal share of HBM, at most
    ``cap_gbs`` a SM) beside the consumers' boundary work (``boundary_us``: epilogue, lookup; KV_EARLY overlaps the
    two), then the item's blocks (``compute_us``; a share ``jitter_share`` of the items, the sequence ends, cost
    ``jitter_us`` more); each item's dK/dV (``write_kib``) leave as write-backs sharing HBM. All SMs start together.
    If the HBM were a fair fluid, would the equal items stay in lockstep (per item ~ compute + the round's burst)?"""
    rnd = random.Random(seed)
    left = [latency_us] * sms  # time left in the current phase (latency), or bytes (load)
    phase = ["latency"] * sms  # latency -> load -> compute (boundary work runs beside latency + load)
    boundary = [0.0] * sms  # the consumers' boundary work left
    done = [0] * sms
    writes, t = 0.0, 0.0
    while min(done) < items:
        loading = sum(p == "load" for p in phase)
        share = min(cap_gbs * 1e3, bw / 1e6 / max(1, loading + (writes > 0)))  # bytes per us
        writes = max(0.0, writes - (bw / 1e6 - share * loading) * dt_us)
        for i in range(sms):
            if done[i] >= items:
                continue
            boundary[i] = max(0.0, boundary[i] - dt_us)
            if phase[i] == "latency":
                left[i] -= dt_us
                if left[i] <= 0:
                    phase[i], left[i] = "load", load_kib * 1024.0
            elif phase[i] == "load":
                left[i] -= share * dt_us
                if left[i] <= 0 and boundary[i] <= 0:
                    phase[i] = "compute"
                    left[i] = compute_us + (jitter_us if rnd.random() < jitter_share else 0.0)
            else:
                left[i] -= dt_us
                if left[i] <= 0:
                    done[i] += 1
                    writes += write_kib * 1024.0
                    phase[i], left[i], boundary[i] = "latency", latency_us, boundary_us
        t += dt_us
    return t / items


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tflops", type=float, default=273.9)  # v22 bench, tlx bwd (bench_2026-12-03_210640_h200)
    ap.add_argument("--fa4", type=float, default=212.6)
    ap.add_argument("--block-us", type=float, default=2.65)
    ap.add_argument("--passes-us", type=float, default=50.0)
    ap.add_argument("--fluid", action="store_true", help="also the fluid sketch (~1 min a cap)")
    a = ap.parse_args(argv)
    c = count()
    hbm = c["kv_bytes"] + c["dkv_bytes"] + c["od_bytes"] + c["stats"]
    measured = c["flops"] / (a.tflops * 1e12) * 1e6
    fa4 = c["flops"] / (a.fa4 * 1e12) * 1e6
    target = fa4 / 2
    kernel = measured - a.passes_us
    items_sm, blocks_sm = c["items"] / SMS, c["blocks"] / SMS
    busiest_items = math.ceil(items_sm)
    fixed = (kernel - blocks_sm * a.block_us) / items_sm
    allowed = (target - a.passes_us - blocks_sm * a.block_us) / items_sm
    kv = c["kv"]
    print(f"lengths: {len(kv)} sequences, sum {sum(kv)}, mean {sum(kv) / len(kv):.1f}, max {max(kv)}")
    print(f"useful FLOPs {c['flops']:.4e}; computed with whole 128-key tiles "
          f"{c['flops'] * c['tiles'] * BLOCK_N / sum(kv):.4e} (x{c['tiles'] * BLOCK_N / sum(kv):.3f})")
    print(f"HBM bytes: K+V {c['kv_bytes'] / 1e6:.0f} MB, dK+dV {c['dkv_bytes'] / 1e6:.0f} MB, O+dO "
          f"{c['od_bytes'] / 1e6:.0f} MB, lse+delta {c['stats'] / 1e6:.1f} MB: {hbm / 1e9:.3f} GB -> "
          f"{hbm / HBM_BPS * 1e6:.0f} us at 4.27 TB/s")
    print(f"compute: {c['flops'] / MMA_FLOPS * 1e6:.0f} us at 700 TFLOP/s; at the dense kernel's block rate "
          f"({a.block_us} us / 64x128 block / SM): {blocks_sm * a.block_us:.0f} us")
    print(f"items (128-key tile, head) {c['items']} = {items_sm:.1f} / SM (busiest {busiest_items}), "
          f"64-row blocks {c['blocks']} = {blocks_sm:.1f} / SM (2 an item)")
    print(f"measured: tlx {measured:.0f} us ({a.tflops} TFLOP/s), FA4 {fa4:.0f} us; 2x FA4 = {target:.0f} us "
          f"({2 * a.fa4:.1f} TFLOP/s)")
    print(f"model: kernel ~{kernel:.0f} us = blocks {blocks_sm * a.block_us:.0f} + items {items_sm:.1f} x "
          f"c; c = {fixed:.2f} us an item (item {2 * a.block_us + fixed:.2f} us, "
          f"{fixed / (2 * a.block_us + fixed):.0%} fixed); HBM average {hbm / kernel / 1e6:.2f} TB/s")
    print(f"2x needs c <= {allowed:.2f} us an item (blocks at the dense rate), HBM then "
          f"{hbm / (target - a.passes_us) / 1e6:.2f} TB/s")
    red = c["dq_reduced"]
    lines = c["dq_acc"] // 128
    per_line_ns = kernel * 1e3 / (red / c["dq_acc"])
    print(f"dQ: {red / 1e9:.3f} GB of fp32 reduce-adds into {c['dq_acc'] // 1024} KiB ({lines} lines of 128 B): "
          f"{red / kernel / 1e6:.2f} TB/s; each line takes one 128-B add every {per_line_ns:.0f} ns; "
          f"~{SMS // 4} SMs add into one head's rows at once")
    burst = SMS * 128 * 1024 / HBM_BPS * 1e6
    print(f"lockstep: a round of {SMS} items moves {SMS * 128 / 1024:.1f} MiB (K/V in, dK/dV out): {burst:.2f} us at "
          f"4.27 TB/s; blocks {2 * a.block_us:.2f} + burst = {2 * a.block_us + burst:.2f} us an item")
    if a.fluid:
        for cap in (60.0, 100.0, 200.0):
            print(f"fluid sketch (fair HBM share, <= {cap:.0f} GB/s a SM, boundary work 1.5 us beside the load): "
                  f"{fluid(cap_gbs=cap):.2f} us an item")
    return 0


if __name__ == "__main__":
    sys.exit(main())
