"""Launch configurations of the TLX kernels (sm_90, 16-bit dtypes): one entry per head dim, no autotuning.

Shared memory per program (bytes, sm_90 allows 232448): two query half-tiles, NUM_BUFFERS_KV key and value blocks,
plus what the compiler adds; ``specializations.py`` compiles every entry and checks it (tests/backends/
test_tlx_compile.py).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

from ..gqa_split import divisors

HEAD_DIMS = (64, 128, 256)
# Overrides of the per-call choices below (None: choose; tools/tlx_check.py flips them to compare in one run).
PIPELINE: Optional[bool] = None
KV_MAJOR: Optional[bool] = None
# The v4 consumer (attn_fwd._consume_tile_one_loop: one software-pipelined loop over a tile's blocks, wgmma really
# in flight across the softmax). None: where it won on the H200 (2026-12-01 22:50, bench/NOTES.md "TLX forward v4":
# 1.03-1.19x the v3 consumers on dense, causal, jagged, GQA, window, D64; 0.86x on broadcast-Q, whose short
# sequences end the loop before its overlap pays), i.e. every call but broadcast-Q at D64/D128. True/False forces it
# (env JFA_TLX_FWD_ONE_LOOP=1/0; tools/tlx_check.py compares both in one run).
ONE_LOOP: Optional[bool] = {"1": True, "0": False}.get(os.environ.get("JFA_TLX_FWD_ONE_LOOP", ""))
# The forward's work order (helper tlxcausal, bench/NOTES.md "TLX forward: short causal"); read per call (tools/tlx_check.py times it beside the default in one process): ZIGZAG
# (JFA_TLX_FWD_ZIGZAG=1) takes the items (query tile, head) in triton.common.zigzag_item's order, kv heads in
# groups (fwd_head_group), tile by tile within a group and the direction alternating between groups, by the snake
# (common.snake_work), instead of static striding over kv-major / tile-major items. Why: kv-major striding by 132
# programs over a dense B8 S2048 causal list (128 tiles of 1-16 key blocks per head) gives program p the ranks p,
# p + 4, p + 8, ... of every head: the busiest program 1.50x the mean (204 vs 136 blocks), which is the whole gap
# to the non-causal row (tools/fwd_schedule_model.py). JFA_TLX_FWD_HEAD_GROUP=N sets the group (kv heads). D64 and
# D128 (the v4 configs; D256's v3 consumers spilled 40-68 B more per thread with it).
# Measured on the H200 (2026-12-02, bench/NOTES.md v16): 1.00-1.58x on every causal/window row (dense S2048 causal
# 361 -> 474 TFLOP/s), 1.087x / 1.007x on the unmasked jagged rows (T16384 n10 / T65536 n63: unequal tiles), but
# 0.93x on dense S2048 without a mask (kv-major striding keeps a head's K/V in the L2 there, and equal tiles need no
# balancing). So None, the default (``forward_zigzag``): masked calls (causal or a window) and jagged ones, not
# one-length unmasked batches; True (JFA_TLX_FWD_ZIGZAG=1): every call; False (=0): none.
FORWARD_ZIGZAG: Optional[bool] = {"1": True, "0": False}.get(os.environ.get("JFA_TLX_FWD_ZIGZAG", ""))
# FORWARD_DYNAMIC (JFA_TLX_FWD_DYNAMIC=1; helper bcast31, bench/NOTES.md "Broadcast-Q forward, helper bcast31, stop
# 31"): forwards on the v3 consumers (broadcast-Q, D256, JFA_TLX_FWD_ONE_LOOP=0) that build a tile list take their
# items from an atomic counter in the list's order (longest first; no zigzag), the producer handing each item's
# index to the consumers with its Q slot (attn_fwd ATOMIC_WORK), instead of static striding / the snake. Why: the
# bench's broadcast-Q case (2048 items of 1-64 key blocks, mean 8.6, over 132 SMs) is as compute- as memory-bound
# (2.04 vs 2.03 us per 128-key block per SM), so the busiest SM sets the time, and the snake leaves it 1.19x the
# mean (greedy: 1.01x; tools/bcast_fwd_model.py). None (``forward_dynamic``; the default since 2026-12-04, stop 33):
# head_dim 256 calls only, measured on the H200 (bench/NOTES.md v23): jagged T32768 D256 causal 1.070x, non-causal
# 1.156x, bits equal; broadcast-Q stays static (1.033x, v22: under its bar). True (=1): every call it applies to;
# False (=0): none. Read per call.
FORWARD_DYNAMIC: Optional[bool] = {"1": True, "0": False}.get(os.environ.get("JFA_TLX_FWD_DYNAMIC", ""))
# Issue 10/11's fixed cost per work item (helper item39, bench/NOTES.md "item39"): STORE_TMA (the v4 consumers, dense
# and block-sparse) writes a consumer's out half-tile through its own Q slot (free once the item's last QK^T has
# completed) and one TMA store, when all 64 rows lie inside the sequence; a partial half-tile keeps the masked pointer
# stores. Why: the pointer stores' layout conversion goes through shared memory in 4 rounds of fp32 plus 3 of m/l, 14
# warpgroup barriers per item (sm_90 D128 bf16); the staged path has one. The same bits (the same division, only
# where the bf16 values are written from).
# On by default since its H200 timing (2026-12-05, stop 40; bench/NOTES.md "STORE_TMA on by default"): tma/tlx dense
# S4096 1.015, jagged 1.015, jagged causal 1.015, B32 S1024 causal 1.037, D64 causal 1.008, broadcast-Q on v4 1.013
# (A/A 0.973-1.009), every row bit for bit the default's; block-sparse -72.7 / -16.4 / -195.8 / -121.0 us (keep 0.5,
# 0.25, causal 0.5, causal 0.25). Env JFA_TLX_FWD_STORE_TMA=0: off (the pointer-store epilogue).
FORWARD_STORE_TMA = os.environ.get("JFA_TLX_FWD_STORE_TMA", "1") != "0"


def forward_dynamic(head_dim: int) -> bool:
    """Whether a forward on the v3 consumers takes its items from the atomic counter (``FORWARD_DYNAMIC``)."""
    return FORWARD_DYNAMIC if FORWARD_DYNAMIC is not None else head_dim == 256


def forward_zigzag(masked: bool, uniform: bool) -> bool:
    """Whether a forward wants the zigzag order (``FORWARD_ZIGZAG``; None: masked or jagged calls, ``uniform``:
    every sequence the same length, known from shapes). The kernel takes it where it applies (D64/D128, a list)."""
    return FORWARD_ZIGZAG if FORWARD_ZIGZAG is not None else (masked or not uniform)


_FWD_HEAD_GROUP_ENV = os.environ.get("JFA_TLX_FWD_HEAD_GROUP", "")
FORWARD_HEAD_GROUP: Optional[int] = int(_FWD_HEAD_GROUP_ENV) if _FWD_HEAD_GROUP_ENV else None
# ZIGZAG's rounds of programs per head group (fwd_head_group): a dense batch's items repeat one cost pattern per
# sequence, so 2 rounds balance it; jagged lists need ~8 (their long tiles are few: tools/fwd_schedule_model.py)
ZIGZAG_ROUNDS = {True: 2, False: 8}


def fwd_head_group(heads_kv: int, group: int, slots: int, programs: int, uniform: bool,
                   head_group: Optional[int] = None) -> int:
    """ZIGZAG's kv heads per group (a divisor of heads_kv; ``group``: q heads per kv head, ``slots``: the tile
    list's capacity, ``programs``: the persistent grid): ``head_group`` / ``FORWARD_HEAD_GROUP`` when set (the
    largest divisor <= it), else the fewest whose items fill ``ZIGZAG_ROUNDS[uniform]`` rounds of the programs (all
    of them when none does). Fewer heads per group: the items in flight share more K/V in the L2; more rounds per
    group: the snake balances better."""
    head_group = FORWARD_HEAD_GROUP if head_group is None else head_group
    heads_divisors = divisors(heads_kv)
    if head_group is not None:
        return max((d for d in heads_divisors if d <= head_group), default=1)
    rounds = ZIGZAG_ROUNDS[uniform]
    return next((d for d in heads_divisors if slots * d * group >= rounds * programs), heads_kv)


# The TLX backward (attn_bwd.py) instead of the triton backend's (D64/D128): on since its v2 consumers' GPU check
# (H200, 2026-12-02: sweeps and the GPU tests passed; v2 with the dQ split 1.22-1.51x the triton backward, bench/NOTES.md
# v12). Env JFA_TLX_BWD=0: the triton backward.
BACKWARD = os.environ.get("JFA_TLX_BWD", "1") != "0"
# Its consumers are v2's (attn_bwd._consume_rows_v2: FA3's un-transposed S, P and dS through shared memory, wgmma
# overlapped; bench/NOTES.md "TLX backward v2"; v1's, 0.65-0.84x the triton backward, were removed: git history,
# 05f76bf). Their dQ split by columns between the two consumers over all 128 keys (FA3's; half the dQ reduce-adds, one
# more barrier between the consumers per block): 1.07-1.33x v2 without it on the H200. On by default; env
# JFA_TLX_BWD_DQ_SHARED=0: off.
BACKWARD_DQ_SHARED = os.environ.get("JFA_TLX_BWD_DQ_SHARED", "1") != "0"
# STATS_AHEAD (helper tlxbwd3, bench/NOTES.md "TLX backward v3 knobs"; a kernel constexpr): lse and delta of the next
# query block prefetched into L1 while this one computes (global loads otherwise issued beside S and waited for right
# after it; FA3 has them in shared memory).
# STATS_AHEAD is on at D64 since its H200 timings: 1.09x the default on B8 H16 S4096 D64 causal in two runs (stops 21
# and 22); at D128 0.86-1.03x (off). JFA_TLX_BWD_STATS_AHEAD=1/0 forces it on/off at every head_dim.
BACKWARD_STATS_AHEAD: Optional[bool] = {"1": True, "0": False}.get(os.environ.get("JFA_TLX_BWD_STATS_AHEAD", ""))
# KV_EARLY (JFA_TLX_BWD_KV_EARLY=1; helper window31, bench/NOTES.md "Sliding-window backward, helper window31, stop
# 31"): each consumer frees its K/V half-tile as soon as both consumers' last products with K/V have completed (the
# epilogue's DS_BARRIER), before its dK/dV epilogue, and the epilogue's two [keys, D] tiles leave through its own
# dQ staging buffer instead ([64, D/2] fp32: the same bytes, idle once the last dQ reduce-add has read it). So the
# producer's next K/V loads (an HBM round trip plus 64 KiB) run under the epilogue instead of after it: ~0.7-1 us of
# a ~6 us per-item gap, which short items pay per ~5 blocks (window (256, 0): 32.5 items per SM). Dense calls of
# the default consumers (v2 with the dQ split, not GROUP_SPLIT). On by default since
# 2026-12-04 (stop 33; bench/NOTES.md v23, H200): window (256, 0) causal 1.021x, window (1024, 0), dense S4096 and
# jagged causal 1.01x, A/A 1.00; JFA_TLX_BWD_KV_EARLY=0 turns it off.
BACKWARD_KV_EARLY = os.environ.get("JFA_TLX_BWD_KV_EARLY", "1") == "1"
# PEEL (JFA_TLX_BWD_PEEL=1; bench/NOTES.md "helper peel37"): the v2 consumers' block loop peeled by stage (masked
# lead, mask-free bulk, masked tail; the producer's order), the bulk's loop without mask code: the
# default's one loop keeps the mask under a runtime branch that ptxas if-converts, so the dS guard of masked blocks
# (34 FSETP + 34 predicated FSEL per thread) issues in every block. sm_90 D128 full: bulk path 535 / 516 -> 458 / 425
# instructions per consumer warp and block, spills 352 -> 444 B per thread (per work item, none in the bulk loop).
# The same arithmetic per block, so the same gradients. Dense calls of the v2 consumers, not MXFP8; off (0) until
# timed on the H200.
BACKWARD_PEEL = os.environ.get("JFA_TLX_BWD_PEEL", "0") == "1"
# STATS_SMEM (JFA_TLX_BWD_STATS_SMEM=1; helper lsedelta40, bench/NOTES.md "Issue 10: the backward's long-scoreboard
# stalls, helper lsedelta40"): the producer loads each query block's lse and delta (64 fp32 each) into shared memory
# by TMA with its Q and dO (the same ring slot and mbarrier: +1 KiB), and the consumers read them from there (4 LDS)
# instead of 4 LDG per block, whose L2 round trips ptxas waits for inside dP's wgmma issue (lse) and after P's store
# (delta): the only global or local loads left on the consumers' block path (sm_90 D128 full: paths 535 / 516 -> 519 /
# 507, the loop's spill reload gone). FA3/FA4 keep them in shared memory the same way. Dense calls, not MXFP8;
# replaces STATS_AHEAD's prefetch (D64) where on; no recipe (its descriptors). Off (0) until timed on the H200.
BACKWARD_STATS_SMEM = os.environ.get("JFA_TLX_BWD_STATS_SMEM", "0") == "1"
# STORE_TMA (JFA_TLX_BWD_STORE_TMA=1; helper dkvtma40, bench/NOTES.md "Issue 10: the backward's dK/dV epilogue through
# TMA, helper dkvtma40"): KV_EARLY's epilogue writes a consumer's dK (scaled) and dV half-tiles, where all 64 keys lie
# inside the sequence, by one TMA store each from its dQ staging buffer (stmatrix in, no read back), instead of
# local_load + masked pointer stores; dV's store waits for dK's read of the buffer, and dV's read is waited for only
# where the buffer is next written (the next dQ staging or epilogue). Why: the stop-40 dkvstore ablation put 2,274 of
# the broadcast-Q backward's 5,513 clk per item (Lq128: 2 blocks an item) in this epilogue (bench/NOTES.md "Stop 40
# on the H200"); the forward's STORE_TMA measured 8x its prediction. Partial half-tiles keep the pointer stores. The
# same bits; where KV_EARLY runs (dense, the dQ split, one part per group, not MXFP8); no recipe (its descriptors).
# Off (0) until timed on the H200.
BACKWARD_STORE_TMA = os.environ.get("JFA_TLX_BWD_STORE_TMA", "0") == "1"
# GQA_SPLIT (JFA_TLX_BWD_GQA_SPLIT=R, rounds; 0: off; helper gqabwd, bench/NOTES.md "TLX GQA backward balance"): a
# dense item (key tile, kv head) walks every q head of the kv head's group, so GQA has group-times fewer, longer
# items: the bench's Hq16:Hkv2 jagged causal row lists 536 items (4.1 per SM), its longest (the 8192-key sequence's
# first tile, 8 heads x 128 blocks) about one SM's mean share, and static striding leaves the busiest SM 1.54x the
# mean (the MHA rows: 1.04-1.08x; tools/gqa_bwd_model.py). With it, each kv head's group is split into
# ``gqa_split_parts`` parts (items of group / parts q heads), their partial dK/dV fp32-added into zeroed
# accumulators (the kernel's GROUP_SPLIT) and cast afterwards, the items under ITEM_ORDER's snake (busiest SM modelled
# 1.02x the mean at 4 parts; 1.12x striding); dense calls without an item list only; calls it does not split (MHA,
# or items enough) keep the default. Measured on the H200 (stop 25, bench/NOTES.md v17 (cont.)): the bench's GQA
# 16:2 jagged causal row 1.34x; but R = 16 splits nearly every GQA call the tlx backend takes, dense equal lengths
# too, where balance is already good and the split only costs (modelled 0.94-0.97x). JFA_TLX_BWD_GQA_SPLIT=auto
# (GQA_SPLIT_AUTO; helper gqarule, bench/NOTES.md "GQA split rule"): ``jfa_ops.backends.gqa_split.plan`` predicts
# from shapes the busiest SM of the default, the snake alone and each part count, with the split's costs, and takes
# the fastest where it gains >= 5% (else the default). Either applies where CAUSAL_ORDER's list does not (its list
# and GROUP_SPLIT do not combine; a one-wave call builds no list). ``auto`` is the default since the H200 run of
# 2026-12-03 (bench/NOTES.md v18: 1.07-2.08x on the GQA rows it splits, 0.99-1.01x where it keeps the default's
# launch and on the MHA controls; its sweep passed); JFA_TLX_BWD_GQA_SPLIT=0 turns it off.
GQA_SPLIT_AUTO = -1
_GQA_SPLIT_ENV = os.environ.get("JFA_TLX_BWD_GQA_SPLIT", "auto")
BACKWARD_GQA_SPLIT = GQA_SPLIT_AUTO if _GQA_SPLIT_ENV == "auto" else int(_GQA_SPLIT_ENV)


def gqa_split_parts(group: int, items: int, programs: int, rounds: int = None) -> int:
    """Parts per kv head's q-head group under GQA_SPLIT (``rounds``: ``BACKWARD_GQA_SPLIT`` when None; 0: off): 1
    when off or when the ``items`` (key tile slots x kv heads) already fill ``rounds`` rounds of the ``programs``,
    else the fewest parts (a divisor of ``group``) whose items do, all ``group`` when none does."""
    rounds = BACKWARD_GQA_SPLIT if rounds is None else rounds
    if rounds <= 0 or group <= 1:  # off, GQA_SPLIT_AUTO (gqa_split.plan decides), MHA
        return 1
    return next((d for d in divisors(group) if items * d >= rounds * programs), group)


# The block-sparse forward (attn_fwd.block_sparse_forward) in the automatic choice for block_sparse_attention: on
# since its GPU check (H200, 2026-12-02: every sweep case run passed; 1.17-1.34x the triton sparse forward, 1.76-3.5x
# the TLX dense forward at keep 0.5/0.25); env JFA_TLX_SPARSE=0 turns it off. backend="tlx" runs it either way.
SPARSE_AUTO = os.environ.get("JFA_TLX_SPARSE", "1") != "0"
# The block-sparse forward's walk bounds through redux.sync (attn_fwd._selected_item's UNIFORM_WALK; helper
# fwduniform, bench/NOTES.md "TLX block-sparse forward: uniform walk"), the backward's SPARSE_BACKWARD_UNIFORM_WALK:
# ptxas then keeps the consumers' block loop in uniform registers as in the dense loop instead of building every
# wgmma descriptor per lane and moving it by R2UR. Same arithmetic, same results. On since its H200 sweep (17 cases)
# and timing (bench/NOTES.md v15: 1.006-1.041x the old walk on the bench's four sparse rows); env
# JFA_TLX_SPARSE_FWD_UNIFORM=0 turns it off (read per call: tools/tlx_check.py times both in one process).
SPARSE_FORWARD_UNIFORM_WALK = os.environ.get("JFA_TLX_SPARSE_FWD_UNIFORM", "1") != "0"
# The block-sparse forward in the dense forward's ZIGZAG order (FORWARD_ZIGZAG: ``common.zigzag_item`` over kv-head
# groups of ``fwd_head_group``, by the snake) instead of static striding over the selected-blocks list, kv-major
# unmasked and tile-major masked (helper sparsefwd, bench/NOTES.md "TLX sparse forward vs FA4, helper sparsefwd,
# stop 26"). Why: tile-major puts all 16 heads' walks in flight at once; a selection's walks share little, so the
# causal rows read ~44 of each 64 KiB K+V block from DRAM (tools/sparse_fwd_model.py --l2; ~4 with kv heads in groups
# of 2, FA4's grid ~3), and striding leaves the busiest SM 2-5% over the mean (zigzag 0.7-1.9%). Same blocks per
# item, same arithmetic: only which SM runs an item and when. On since the H200 run of 2026-12-03 (bench/NOTES.md
# v18: 1.013-1.062x on the bench's four sparse rows, sweep and bit-for-bit tests passed); env
# JFA_TLX_SPARSE_FWD_ZIGZAG=0 turns it off.
SPARSE_FORWARD_ZIGZAG = os.environ.get("JFA_TLX_SPARSE_FWD_ZIGZAG", "1") != "0"
# The block-sparse forward's walk reads, earlier (helper sparsefwd, bench/NOTES.md "TLX sparse forward vs FA4": our
# per-item cost fits 3.25 us, and each item's walk, ``attn_fwd._selected_item``, is ~3 dependent L2 reads and two
# cross-warp sums, in the producer and again in both consumers): (1) the producer reads item i + 1's work entry and
# walk after issuing item i's first NUM_BUFFERS_KV tiles, when the K/V ring is full and it would wait anyway, instead
# of after item i's last tile (items of <= 2 tiles unchanged); (2) every walk reads its row's first ids beside the
# count instead of after it (``selected_tile_range``'s width): one dependent read less per item, for the producer
# and the consumers (whose walk sits between their last PV and the next item's first QK^T). The same tiles in the
# same order: same results (GPU bit-for-bit tests passed, v18). Timed on the H200 (v18, sparse-timing, one round,
# both/zigzag): keep 0.5 1.003, keep 0.25 0.991, causal keep 0.5 1.008, causal keep 0.25 1.028: the masked rows, whose
# items are short (16% / 29% of 1-2 blocks, where the producer's walk has no tiles to hide behind), gained. Since
# helper sparse38 (bench/NOTES.md "Issue 11: ... helper sparse38") also "masked": on for masked calls (causal or a
# window) only (``sparse_walk_ahead``). Off by default: stop 38's H200 ablation (three interleaved rounds) had the
# causal rows 0.3% / 1.5% faster with it off (its flip rule: revert if either is below 0.99). Env
# JFA_TLX_SPARSE_FWD_WALK_AHEAD=1 every call, =masked masked calls, =0 none (read per call; True / False / "masked").
_WALK_AHEAD_ENV = os.environ.get("JFA_TLX_SPARSE_FWD_WALK_AHEAD", "0")
SPARSE_FORWARD_WALK_AHEAD = "masked" if _WALK_AHEAD_ENV == "masked" else _WALK_AHEAD_ENV == "1"


def on_for_call(setting, masked: bool) -> bool:
    """A knob set to True, False or "masked" (causal or windowed calls only), for a call (``masked``: causal or a
    window)."""
    return setting is True or (setting == "masked" and masked)


def sparse_walk_ahead(masked: bool) -> bool:
    """The block-sparse forward's WALK_AHEAD for a call under ``SPARSE_FORWARD_WALK_AHEAD``."""
    return on_for_call(SPARSE_FORWARD_WALK_AHEAD, masked)


# Timing-only ablation of the block-sparse forward (helper sparse38; wrong results: never in a real call): 1 never takes
# the block loop's masked branch (the causal diagonal runs as an unmasked block), the kernel's SPARSE_ABLATE; env
# JFA_TLX_SPARSE_FWD_ABLATE=1 (read per call). tools/tlx_check.py sparse-ablation sets it per column.
SPARSE_FORWARD_ABLATE = int(os.environ.get("JFA_TLX_SPARSE_FWD_ABLATE", "0"))
# PEEL (JFA_TLX_SPARSE_FWD_PEEL=1; bench/NOTES.md "helper peeldiag38"): the block-sparse forward's consumers walk
# their selected tiles in a mask-free loop and masked loops (the kernel's SPARSE_PEEL), split where the walk leaves
# the mask-free bulk (found in the same pass over the row's ids as the walk itself): the one loop's runtime
# ``if masked`` costs the mask-free blocks a test and branch and consumer 0 32 PRMT, and its masked branch spilled
# (28 STL/LDL a block in consumer 0: helper sparse38's causal diagonal, nomask -64 / -71 us per SM). sm_90 D128 bf16
# causal: mask-free loop 468 / 468 instructions per consumer warp and block (one loop 507 / 481; dense 498 / 470),
# masked loop 691 / 607, no STL/LDL in any loop, spills 156 -> 116 B. The same blocks, order and arithmetic: the
# same bits. Off (0) until timed on the H200 (tools/tlx_check.py sparse-ablation's "peel" column; its flip rule in
# bench/NOTES.md); read per call; ignored under SPARSE_FORWARD_ABLATE.
SPARSE_FORWARD_PEEL = os.environ.get("JFA_TLX_SPARSE_FWD_PEEL", "0") == "1"
# FIRST_UNMASKED (JFA_TLX_SPARSE_FWD_FIRST_UNMASKED=1 or =masked; helper itemcost, stop 56): each block-sparse item's
# first key block takes the block loop's mask form (the key interval mask only when its tile lies outside the
# mask-free bulk) instead of the always-masked first-block softmax, the kernel's FIRST_UNMASKED: most items' first
# tile is mask-free, so their prologue skips the mask (sm_90 D128 bf16 causal: consumer 0's prologue 889 -> 464 instructions, FSEL
# 194 -> 2, its spills gone; the block loop unchanged). An all-visible mask is the identity: the same bits. Timed
# by tools/tlx_check.py sparse-ablation's "firstunmasked" / "firstmasked" columns. Stop 56 (H100, us over the default,
# keep 0.5 / 0.25 / causal 0.5 / causal 0.25): +32.5 / +44.7 / -179.4 / -43.6 (A/A -5.9 / +17.1 / -21.6 / -22.9):
# faster on the causal rows only, hence =masked (causal or windowed calls only; =1 every call, =0 none). "masked" by
# default since stop 57: its GPU twin passed whole (16 cases, H100) and =masked measured -38 / -41 / -35 us on
# causal keep 0.25 (1.45 ms) and -7 / -36 / -20 us on causal keep 0.5 in three ablations: faster in all eight causal
# cells over stops 56-57, while the unmasked rows (the same kernel there: an A/A) scattered +-59 us both ways.
# Read per call; ignored under SPARSE_FORWARD_ABLATE.
_FIRST_UNMASKED_ENV = os.environ.get("JFA_TLX_SPARSE_FWD_FIRST_UNMASKED", "masked")
SPARSE_FORWARD_FIRST_UNMASKED = "masked" if _FIRST_UNMASKED_ENV == "masked" else _FIRST_UNMASKED_ENV == "1"
# The block-sparse backward on the TLX v2 backward (attn_bwd.block_sparse_backward: SPARSE, each key tile walking the
# query tiles of the Q blocks that selected it) instead of the triton sparse backward: on since its GPU check (H200,
# 2026-12-02: 11 sweep cases passed; 1.38-1.46x the triton sparse backward); env JFA_TLX_SPARSE_BWD=0 turns it off
# (tools/tlx_check.py toggles it in-process).
SPARSE_BACKWARD = os.environ.get("JFA_TLX_SPARSE_BWD", "1") != "0"
# Experiments on the backward's schedule (helper sparsebwd2, bench/NOTES.md "TLX block-sparse backward v2"), off
# until measured on the H200; read per call (tools/tlx_check.py A/Bs them in one process):
# - HEAD_GROUP (JFA_TLX_BWD_HEAD_GROUP=G): work items (key tile, kv head) ordered in groups of G kv heads (each group
#   its whole tile list, longest first, before the next group's), so the ~132 items in flight walk the Q/dO/dQ rows
#   of G heads instead of all (tile-major, 0: the default): more L2 reuse where walks diverge (block-sparse,
#   causal). The host takes the largest divisor of the kv heads <= G; one that is all of them is tile-major. Dense
#   and block-sparse; a runtime argument (no new specialization beyond HEAD_GROUPED's one).
# - ITEM_ORDER (JFA_TLX_BWD_ITEM_ORDER=1): items taken in a snake (every other round of ~132 in reverse) over the
#   list sorted longest first, and for block-sparse a list of the items themselves sorted by each one's own blocks
#   (the tile list sums the heads, whose walks differ): the busiest SM 0.4-0.7% over the mean instead of 4-8% on the
#   bench's sparse batch; dense 1.2% / 0.2% (causal) instead of 2.0% / 2.5%. Overrides HEAD_GROUP.
#   Block-sparse: HEAD_GROUP and ITEM_ORDER apply with SPARSE_UNIFORM_WALK only (alone they spilled 12-28 B
#   more).
# - GROUP_ORDER (JFA_TLX_BWD_GROUP_ORDER=1; helper hgorder, bench/NOTES.md "ordered head groups"): block-sparse with
#   head groups (HEAD_GROUP / SPARSE_HEAD_GROUP) and the uniform walk: ITEM_ORDER's snake over a per-item list that
#   is group-major, each group sorted by the items' own blocks, the last group longest first and the directions
#   alternating before it (``block_sparse_bwd.zigzag_groups``): HEAD_GROUP's L2 reuse (the items in flight are one
#   group's) with ITEM_ORDER's balance (modelled 0.4-1.1% over the mean instead of 5-9%). ITEM_ORDER's kernel.
# - SPARSE_UNIFORM_WALK (JFA_TLX_SPARSE_BWD_UNIFORM=1): the block-sparse walk's bounds through redux.sync, so
#   ptxas keeps the consumers' block loop in uniform registers as in the dense loop (attn_bwd._selected_rows: without
#   it every wgmma descriptor of the loop is built per lane and moved by R2UR: 928 vs 664 instructions per block).
# SPARSE_UNIFORM_WALK is on since its H200 sweeps and timings (bench/NOTES.md v14: 1.01-1.02x alone; env
# JFA_TLX_SPARSE_BWD_UNIFORM=0 turns it off). With it, kv heads in groups in GROUP_ORDER are the block-sparse
# default since stop 23's H200 sweeps (15 cases each, hg4 and hg4 + group order, an H8 case among them) and timings
# (bench/NOTES.md v15: groups of 4 1.17-1.32x the uniform walk alone); groups of 2 since stop 24 (their sweep 15/15,
# bench/NOTES.md v16; v15's timings 1.02-1.03x groups of 4: 2.0x / 3.4x the TLX dense backward at keep 0.5 / 0.25,
# causal 2.0x / 3.0x, selection not counted; fewer heads per group: the items in flight share more Q/dO/dQ in L2).
# Env JFA_TLX_BWD_HEAD_GROUP=N sets the group (0: tile-major), JFA_TLX_BWD_GROUP_ORDER=0 the plain head-group order.
# HEAD_GROUP unset: SPARSE_HEAD_GROUP for the block-sparse backward, 0 (tile-major) dense.
_HEAD_GROUP_ENV = os.environ.get("JFA_TLX_BWD_HEAD_GROUP", "")
BACKWARD_HEAD_GROUP: Optional[int] = int(_HEAD_GROUP_ENV) if _HEAD_GROUP_ENV else None
SPARSE_HEAD_GROUP = 2
SPARSE_BACKWARD_UNIFORM_WALK = os.environ.get("JFA_TLX_SPARSE_BWD_UNIFORM", "1") != "0"
# SPARSE_KV_EARLY (JFA_TLX_SPARSE_BWD_KV_EARLY=1; helper sparsebwd45, bench/NOTES.md "Issue 11: the sparse backward's
# causal keep 0.25, helper sparsebwd45"): the block-sparse backward with the dense default's KV_EARLY (K/V freed before
# the dK/dV epilogue, which stores through the dQ staging buffer; BACKWARD_STORE_TMA rides on it as on the dense
# path). Every sparse item ends in that epilogue, and the next item's walk adds two dependent index reads
# (``_selected_rows``) before its first Q/dO load, which KV_EARLY lets the producer issue under the epilogue. The
# same epilogue code as the dense default's (no jit source changed; the SPARSE + KV_EARLY specializations are new):
# the same bits. Off (0) until timed on the H200 (tools/tlx_check.py sparse-bwd-ablation); read per call.
SPARSE_BACKWARD_KV_EARLY = os.environ.get("JFA_TLX_SPARSE_BWD_KV_EARLY", "0") == "1"
BACKWARD_ITEM_ORDER = os.environ.get("JFA_TLX_BWD_ITEM_ORDER", "0") == "1"
# SPARSE_SECTIONS (JFA_TLX_SPARSE_BWD_SECTIONS=0 turns it off; on since stop 55, bench/NOTES.md "Stop 54", "Stop 55"):
# the block-sparse backward's items in CAUSAL_ORDER's L2 sections of (sequence, kv head) streams, each section by the
# items' own walks under the snake (``block_sparse_bwd.sectioned_item_list``), instead of head groups each longest
# first across the batch (``item_list``), whose causal items in flight span many streams (ncu, H100, causal keep
# 0.25: L2 hit rate 56%, DRAM at 59% of peak). Measured on the H100 (the bench's four sparse rows, backward alone,
# keep 0.5 / 0.25 / causal 0.5 / causal 0.25): stop 54 1.040 / 1.010 / 1.070 / 1.179x, stop 55 0.990 / 1.001 / 1.098
# / 1.137x (the A/A 0.99-1.05); 30 MiB sections 0.968 / 1.021 / 1.074 / 1.156x, 48 MiB 0.975 / 0.923 / 1.045 /
# 1.075x, 20 MiB (stop 54) 1.034 / 0.969 / 1.008 / 1.067x: 40 MiB kept. Not broadcast Q (its query rows are one
# stream). The same kernel and items: dK/dV bit for bit, dQ's fp32 adds reordered (stop 55's GPU twins: 24 passed).
# Read per call.
SPARSE_BACKWARD_SECTIONS = os.environ.get("JFA_TLX_SPARSE_BWD_SECTIONS", "1") == "1"
# SPARSE_SECTIONS_DEVICE (JFA_TLX_SPARSE_BWD_SECTIONS_DEVICE=0 turns it off; on since stop 56): SPARSE_SECTIONS' list
# built on the device (``block_sparse_bwd.sectioned_item_list_device``: two launches and one allocation, no sort; bit
# for bit the torch list) instead of the torch list's 49 small device ops (~140 us of kernels on the bench's sparse
# batch, two sorts ~58 us of it). Measured (H100, stop 56, backward alone, 3 interleaved rounds, keep 0.5 / 0.25 /
# causal 0.5 / causal 0.25): 1.016 / 1.065 / 0.991 / 1.043x (A/A 0.985 / 1.018 / 0.981 / 1.000), causal 0.25 again
# 1.048x (A/A 1.002); its GPU twin passed. Its places kernel compares items x items (8,720^2 there), so lists past
# ``SECTIONS_DEVICE_MAX_ITEMS`` take the torch path. Read per call.
SPARSE_BACKWARD_SECTIONS_DEVICE = os.environ.get("JFA_TLX_SPARSE_BWD_SECTIONS_DEVICE", "1") == "1"
# SPARSE_DELTA_STREAM (JFA_TLX_SPARSE_BWD_DELTA_STREAM=1; stop 58): the block-sparse backward's delta pre-pass (delta
# and the fp32 dQ zeroing: ~383 us of HBM traffic on the H100's bench batch) on a side stream, while the current stream
# builds the transposed selection and the item list (~6 small latency-bound launches, ~40-60 us). The kernel waits for
# both. The same launches and arguments, so the same bits (dQ's adds reorder as always). Predicted: -30 to -50 us a
# sparse backward call (bench/NOTES.md "Stop 58"); off until tools/tlx_check.py sparse-bwd-ablation's column
# "deltastream" is timed. Read per call.
SPARSE_BACKWARD_DELTA_STREAM = os.environ.get("JFA_TLX_SPARSE_BWD_DELTA_STREAM", "0") == "1"
# CAUSAL_ORDER (JFA_TLX_BWD_CAUSAL_ORDER=1; helper tlxbwdcausal, bench/NOTES.md "TLX backward: causal"): dense calls
# with a mask (causal, windows: key tiles of unequal cost, so the key tile list is sorted across sequences) and more
# items than one wave take a per-item list: (sequence, kv head) streams, longest sequence first, in sections whose
# Q/dO/fp32 dQ rows fill CAUSAL_ORDER_L2_BYTES, each section longest first with its streams side by side, under the
# snake (``block_sparse_bwd.causal_item_list``; FA3/FA4 keep a stream's key blocks together the same way): the
# default tile-major order runs one item per stream at the bench's B8 H16 causal rows, nearly every Q/dO read and
# dQ reduce-add an L2 miss (modelled 90-95 KiB of DRAM per block, 4-16 with the list, 10-13 with the full mask).
# The block-sparse item order's kernel path (ITEM_LIST + SNAKE). Measured on the H200 (2026-12-02, bench/NOTES.md
# v16, causal/default in one process): dense causal D128 S2048 / S4096 / S8192 1.27 / 1.40 / 1.34x with the list
# kept per shape (S2048 0.96x with it made per call: ~59 host ops), jagged causal T32768 / T16384 1.05 / 1.01x. So
# None, the default: one-length causal batches (``attn_bwd.one_length_causal``: the kept list); True
# (JFA_TLX_BWD_CAUSAL_ORDER=1): every masked call; False (=0): none.
BACKWARD_CAUSAL_ORDER: Optional[bool] = {"1": True, "0": False}.get(os.environ.get("JFA_TLX_BWD_CAUSAL_ORDER", ""))
CAUSAL_ORDER_L2_BYTES = 40 << 20
# CAUSAL_ORDER_JAGGED (on; JFA_TLX_BWD_CAUSAL_ORDER_JAGGED=0 off; helper jaggedorder, bench/NOTES.md "causal order
# list on the device"): the per-call list built on the device (``block_sparse_bwd.causal_item_list_device``: two
# launches and one allocation for the torch list's 59 ops, bit for bit its list), and with CAUSAL_ORDER unset (None)
# every masked call takes a list, jagged ones too, except where a GQA split runs (GQA_SPLIT's plan: its balance at
# few kv heads; CAUSAL_ORDER=1's list still wins there). Measured on the H200 (bench/NOTES.md v21, helper
# uniformorder's rule, columns in alternating order): jagged T32768 causal backward 1.11x, T16384 1.03x, a one-length
# batch passed without max_seqlen hints 1.41x (the default there is tile-major); the A/A controls 0.98 / 1.01.
BACKWARD_CAUSAL_ORDER_JAGGED = os.environ.get("JFA_TLX_BWD_CAUSAL_ORDER_JAGGED", "1") == "1"
# Its items kernel counts over the tile list per item (items x tiles pairs, ~19 int ops each: ~40 us of the H200 at
# 2**25); above that (e.g. T262144 H16: 83M) the torch list (its ~59 ops, a few sorts' GPU time) costs less.
CAUSAL_ORDER_DEVICE_MAX_PAIRS = 1 << 25
# The list buys DRAM bytes, so it pays only where the default's causal loop is DRAM-bound (helper causalorder2,
# bench/NOTES.md "TLX causal backward order v2"): a block reads 64 rows of Q + dO and reduce-adds 64 rows of fp32 dQ
# (all misses in the default order: 12 x 64 x D bytes with the dQ write-back), while its softmax / dS work on the
# 64 x 128 scores does not shrink with D; at D128 the default pulls 3.2-3.6 TB/s (the H200's practical rate), at
# D64 2.9 TB/s (44.6 KiB per 2.05 us block, x 132 SMs): compute-bound, measured 0.98x with the list.
CAUSAL_ORDER_MIN_HEAD_DIM = 128
BACKWARD_GROUP_ORDER = os.environ.get("JFA_TLX_BWD_GROUP_ORDER", "1") != "0"


def head_group(heads_kv: int, group: int = None, sparse: bool = False) -> int:
    """``BACKWARD_HEAD_GROUP`` (or ``group``; unset: ``SPARSE_HEAD_GROUP`` for the block-sparse backward, 0 dense)
    for ``heads_kv`` kv heads: the largest divisor of heads_kv <= it, 0 (tile-major) when that is none or all of
    them."""
    group = BACKWARD_HEAD_GROUP if group is None else group
    if group is None:
        group = SPARSE_HEAD_GROUP if sparse else 0
    g = max((d for d in range(1, min(group, heads_kv) + 1) if heads_kv % d == 0), default=0)
    return 0 if g in (0, heads_kv) else g


# SPARSE_AUTO_GROUP (JFA_TLX_SPARSE_BWD_AUTO_GROUP=1; helper sparsehg47, bench/NOTES.md "Sparse backward head groups
# by rule"): the block-sparse backward's head group per call (``sparse_auto_head_group``) instead of SPARSE_HEAD_GROUP:
# groups of 1 kv head where tools/sparse_bwd_model.py's LRU and balance terms say one head's rows reuse the L2 better
# and its items alone still balance, else SPARSE_HEAD_GROUP (groups of 4 lost on every modelled shape). Shapes only
# (no sync); an explicit JFA_TLX_BWD_HEAD_GROUP wins. The same kernel (the group is list data). On since stop 48
# (H100: keep 0.25 backward 1.063x, the other rows 1.000-1.003x; its 8 GPU twins passed); =0 turns it off; read per call.
SPARSE_BACKWARD_AUTO_GROUP = os.environ.get("JFA_TLX_SPARSE_BWD_AUTO_GROUP", "1") != "0"
# The rule's bound (``sparse_auto_head_group``; from tools/sparse_bwd_model.py --groups, bench/NOTES.md sparsehg47):
AUTO_GROUP_MAX_SKEW = 2.0  # a group of one kv head: its longest item over an SM's share of the group, bounded
AUTO_GROUP_L2_BYTES: Optional[int] = None  # None: the device's L2 (torch's L2_cache_size; tests set a small one)


def sparse_auto_head_group(heads_kv: int, q_per_kv: int, head_dim: int, q_rows: int, kv_rows: int, num_seqs: int,
                           max_seqlen_kv: int, causal: bool, sms: int, l2_bytes: int, block_n: int = 128) -> int:
    """The block-sparse backward's head group from shapes (before ``head_group``'s divisor rule): 1 where both terms
    hold, else ``SPARSE_HEAD_GROUP``. Why (tools/sparse_bwd_model.py ``group_terms``: an LRU of the L2 and the
    busiest SM's load under the shipped order; bench/NOTES.md "Sparse backward head groups by rule"):

    - L2: the ~SM-count items in flight walk the Q, dO and fp32 dQ rows of their group's kv heads (8 x q_per_kv x
      head_dim bytes a row). Where one head's rows overflow the L2, groups of 2 evict each other's rows before the
      next key tile reads them (modelled 1.2-3.5x the DRAM a block of groups of 1); where they fit, both hit
      (D64 and 22 x 1k on the model: ties).
    - Balance: a group of one head is 1 / heads_kv of the items, and the snake balances a group only where its
      longest item is small against an SM's share of the group. Bounded from shapes (no lengths, no sync): longest
      item over mean item <= num_seqs x max_seqlen / kv_rows (x2 causal: the costs fall along a sequence), an SM's
      share = kv_rows / block_n / sms items; x q_per_kv (GQA: the model's jagged GQA rows lost at a skew where MHA
      won). Over ``AUTO_GROUP_MAX_SKEW`` (2.0, between the model's wins at 1.36-1.42 and its loss at the bench's
      causal 2.72) the default's groups of 2 (twice the share) balance better than one head's rows save."""
    fallback = SPARSE_HEAD_GROUP
    if heads_kv < 2 or num_seqs <= 0 or kv_rows <= 0 or max_seqlen_kv <= 0 or sms <= 0:
        return fallback
    if 8 * q_per_kv * head_dim * q_rows <= l2_bytes:  # bf16 Q and dO, fp32 dQ of one kv head's q heads fit
        return fallback
    skew = (2 if causal else 1) * q_per_kv * num_seqs * max_seqlen_kv * block_n * sms / kv_rows ** 2
    return 1 if skew <= AUTO_GROUP_MAX_SKEW else fallback


# The MXFP8 forward (mxfp8_attn_fwd.py) in the automatic choice for mxfp8_attention: on since its GPU check (H200,
# 2026-12-02: every sweep case passed issue 12's bound; 2.06x the triton MXFP8 forward dense, 1.25x broadcast-Q; its
# FP8 accumulation differs from the bf16smem variant by ~3e-3 relative); env JFA_TLX_MXFP8=0 turns it off.
MXFP8_AUTO = os.environ.get("JFA_TLX_MXFP8", "1") != "0"
# bf16/fp16/fp32 inputs of the MXFP8 forward: the quantize kernel writes the forward's re-based operands itself (one
# pass: input read once, E4M3 written once; bit for bit what quantize + the re-basing stage give, tested under the
# interpreter), instead of the MX pairs then mxfp8_rebase's pass over them (bench/NOTES.md "MXFP8 fused re-basing +
# fp32 PV"). Env JFA_TLX_MXFP8_FUSED_QUANTIZE=0: the two passes (tools/tlx_check.py compares both in one run).
MXFP8_FUSED_QUANTIZE = os.environ.get("JFA_TLX_MXFP8_FUSED_QUANTIZE", "1") != "0"
# With MXFP8_FUSED_QUANTIZE: V's tiles fused too (else V through its pair and the re-basing stage, Q and K fused).
# The fused V-tile program is nearly ALU-bound on sm_90 (25.8 SASS per element: 85% of the HBM rate at full issue):
# predicted 0-25% faster than V's two passes, with 40% fewer bytes; measured slower on the H200 (bench/NOTES.md v14:
# bf16 in, Q/K fused and V in two passes 451.5 / 128.9 TFLOP/s dense / broadcast-Q vs all fused 446.9 / 114.3), so
# off. Env JFA_TLX_MXFP8_FUSED_V=1: on; tools/tlx_check.py times both.
MXFP8_FUSED_V = os.environ.get("JFA_TLX_MXFP8_FUSED_V", "0") == "1"
# The MXFP8 forward's S = Qr Kr^T as the two halves of head_dim (2; 1: one wgmma chain), each a fresh wgmma
# accumulator, added in fp32 (FA3/DeepSeek's promotion of FP8 partial sums). PV is promoted per key tile already (a
# fresh accumulator per 128 keys, joined to O in fp32: the SASS's first PV QGMMA of a tile has "RZ, !UPT"). A model of
# Hopper's FP8 accumulation (tools/mxfp8_accumulation_model.py: e8m13, truncating) puts the kernel's error vs its
# exact arithmetic in S's chain over head_dim, none in PV: N(0, 1) 3.9e-3 (S exact: 1.4e-4; PV promoted per 32 keys:
# 3.9e-3; S in halves: 2.0e-3). Cost at D128 (sm_90 SASS per key block): 709 -> 785 instructions (+64 FADD, 1 LDL),
# spills 0 -> 28 / 56 B (with a left window 1044 / 1004 B; four chunks: 3.2 KB): -5..-10% predicted. Off (1) until
# the H200 measures it: the kernel meets issue 12's bound without it (bench/NOTES.md "MXFP8 fused re-basing + fp32
# PV"). Env JFA_TLX_MXFP8_QK_CHUNKS=2.
MXFP8_QK_CHUNKS = int(os.environ.get("JFA_TLX_MXFP8_QK_CHUNKS", "1"))
# The MXFP8 forward's key and column factors loaded by the producer's TMA with each key block's K and V^T tiles into
# the ring's slots (K's factors first put in V's tile layout, ``mxfp8_rebase.key_factor_tiles``: a TMA box must
# start 16-byte aligned), read by the consumers from shared memory, instead of two global loads per block whose
# vectors pass through a shared-memory layout conversion (3 BAR.SYNC) and whose latency the consumer waits out when
# K is already resident (broadcast-Q: the factors come from HBM, 2,000 of 6,900 clk a block in stop 47's ablation).
# The same values, so the same results bit for bit (helper mxbcast48, bench/NOTES.md "Issue 12: the broadcast-Q
# forward's MX factors by TMA"). On since stop 49 (H100, bench/NOTES.md "Stop 49"): the kernel alone 0.80-0.87x
# the loads' time on all five rows (broadcast-Q 0.481 -> 0.402 ms), the pre-quantized call with the tiling pass
# 0.907 -> 0.839 ms; its 14 GPU twins equal the loads' kernel bit for bit. Env JFA_TLX_MXFP8_FACTORS_TMA=0: the loads.
MXFP8_FACTORS_TMA = os.environ.get("JFA_TLX_MXFP8_FACTORS_TMA", "1") == "1"
# With MXFP8_FACTORS_TMA: K's re-basing launch writes K's row factors straight into V's tile layout
# (``mxfp8_rebase.rebase_key_tiles`` for pre-quantized pairs, ``mxfp8_quantize.quantize_rebased_key_tiles`` for bf16
# in: programs by 32 keys of a padded tile, zeros past each sequence's end), so ``key_factor_tiles``' extra launch
# and its ~18 MB on the broadcast-Q row go away; the same factors and re-based K bit for bit (helper kfold50,
# bench/NOTES.md "Issue 12: K's factors tiled by K's re-basing launch"). Predicted ~1-1.5% of the broadcast-Q call
# (stop 49 measured the tiling pass at ~14 us of 0.839 ms); off until measured. Env JFA_TLX_MXFP8_TILED_KEY_FACTORS=1.
MXFP8_TILED_KEY_FACTORS = os.environ.get("JFA_TLX_MXFP8_TILED_KEY_FACTORS", "0") == "1"
# The MXFP8 forward's P enters P V's wgmma in the registers the accumulator left it in: V^T's keys stored in that
# order within each 16 keys (``mxfp8_rebase.v_key_slot``, written by ``rebase_v_tiles``), P's columns renamed to match
# (``mxfp8_rebase.p_in_v_key_order``), so Triton's layout conversion of P (16 SHFL.IDX + 16 SEL + 16 PRMT per key
# block and consumer, sm_90 SASS) is gone: D128 dense loop path 766 -> 718 instructions, masked 958 -> 909, 0 spills
# (helper mxfmul49, bench/NOTES.md "Issue 12: the MXFP8 forward's per-block cost after FACTORS_TMA"). P V and P x
# ones sum the same products (permuted within each 16 keys, inside one k-step of the wgmma). Predicted 1.2-3.7% faster
# on the kernel (dense 1.4-2.8%; stop 51 measured the pair with ROWSUM_ONE_COLUMN 2-5% faster, the kernel alone).
# Off again since stop 53: the whole call from bf16 was 1.1 ms slower on dense B8 S4096 (3.25 vs 2.13 ms) and 4.5 ms on
# broadcast-Q (5.71 vs 1.19 ms), because ``rebase_v_tiles`` stored V^T at permuted columns byte by byte (bench/NOTES.md
# "Stop 53"). Its rows are now renamed in registers before a contiguous store (sm_90 PTX: the natural order's 16-byte
# stores); on again only once the bf16-in call is timed with it. Env JFA_TLX_MXFP8_PERMUTED_V_KEYS=1: the permuted
# order.
MXFP8_PERMUTED_V_KEYS = os.environ.get("JFA_TLX_MXFP8_PERMUTED_V_KEYS", "0") == "1"
# The MXFP8 forward's denominator term per key block from one column of P x ones (``mxfp8_rebase.first_column``: a
# reduce whose combine keeps its first operand) instead of the row max of its 32 columns, which are equal (the ones'
# columns are): ptxas drops the max's 18 FMNMX + 4 SHFL, sm_90 loop path 766 -> 744 (with PERMUTED_V_KEYS 718 -> 696),
# the same results bit for bit (helper mxexact50, bench/NOTES.md "Issue 12: the MXFP8 forward's two other exact
# options"). Predicted 0.4-1.7% faster on the kernel. On since stop 51 (measured with PERMUTED_V_KEYS, bench/NOTES.md
# "Stop 51"; alone, stop 53: dense 1.840 vs 1.888 ms, broadcast-Q 0.399 vs 0.404 ms, one round). Env
# JFA_TLX_MXFP8_ROWSUM_ONE_COLUMN=0: the row max.
MXFP8_ROWSUM_ONE_COLUMN = os.environ.get("JFA_TLX_MXFP8_ROWSUM_ONE_COLUMN", "1") == "1"
# The MXFP8 backward on Hopper, design (D) (bench/NOTES.md "MXFP8 backward design (D), helper mxbwdd, stop 27";
# ``mxfp8_attn_bwd.py``): the bf16 TLX backward kernel with its MXFP8 constexpr (P and dS rounded to their MXFP8
# values in registers, P clamped to <= 1), fed MX-valued bf16 Q, K, V, dO (the triton quantize kernel, then one
# dequantize pass) and delta from the unquantized dO: ``mxfp8_attention_backward_model``'s arithmetic. Measured on
# the H200 (bench/NOTES.md v19): 2.50x (dense B8 S4096) / 2.23x (jagged T32768 causal) the triton MXFP8 backward end to
# end, its gradients within 0.1% of the MXFP8 oracle's own error: on by default. JFA_TLX_MXFP8_BWD=0: the triton one
# for every call (fp16/bf16 inputs at head_dim 64/128 take this one; the rest keeps the triton one).
MXFP8_BACKWARD = os.environ.get("JFA_TLX_MXFP8_BWD", "1") != "0"
# ABLATIONS OF THE MXFP8 FORWARD: TIMING ONLY, THEIR RESULTS ARE WRONG. Each bit removes one stage of the consumers'
# key-block loop (mxfp8_attn_fwd.py's ABLATE_*), every barrier, TMA load and ping-pong turn kept, so the H200 can say
# what each stage costs (bench/NOTES.md "MXFP8 ceiling: ablations"; tools/tlx_check.py mxfp8-ablation):
# pquant: P enters P V as a constant E4M3 tile (no convert/pack of P); softmax: no row max, exp2, row sum or
# rescale (P = E4M3(S)); factors: no key/column factor loads or multiplies; pv: no P V wgmma; rowsum: no ones
# wgmma (the denominator's row sums). Env JFA_TLX_MXFP8_ABLATE=pquant,softmax,... (default none: 0).
MXFP8_ABLATIONS = {"pquant": 1, "softmax": 2, "factors": 4, "pv": 8, "rowsum": 16}


def _ablation_mask(table: dict, names: str, what: str) -> int:
    """The ABLATE bits of a comma-separated list of ``table``'s names ("" or "none": 0)."""
    parts = [n.strip() for n in names.split(",") if n.strip() and n.strip() != "none"]
    unknown = [n for n in parts if n not in table]
    if unknown:
        raise ValueError(f"unknown {what} ablations {unknown}; known: {sorted(table)}")
    return sum({table[n] for n in parts})


def _ablation_names(table: dict, mask: int) -> str:
    """``_ablation_mask``'s inverse ("none" for 0)."""
    return ",".join(n for n, bit in table.items() if mask & bit) or "none"


def mxfp8_ablation_mask(names: str) -> int:
    """The ABLATE bits of a comma-separated list of ``MXFP8_ABLATIONS`` names ("" or "none": 0)."""
    return _ablation_mask(MXFP8_ABLATIONS, names, "MXFP8")


def mxfp8_ablation_names(mask: int) -> str:
    """``mxfp8_ablation_mask``'s inverse ("none" for 0)."""
    return _ablation_names(MXFP8_ABLATIONS, mask)


MXFP8_ABLATE = mxfp8_ablation_mask(os.environ.get("JFA_TLX_MXFP8_ABLATE", ""))
# What tools/tlx_check.py mxfp8-ablation times (and tools/tlx_compile.py ablate compiles), each a
# mxfp8_ablation_mask list: one stage at a time, then the stages together down to the MMA + convert floor. "pquant"
# and "softmax" exclude each other (the kernel asserts it): nothing would read S, and ptxas drops its wgmma.
MXFP8_ABLATION_RUNS = ("none", "pquant", "softmax", "factors", "pv", "rowsum", "pquant,factors", "softmax,factors",
                       "softmax,factors,rowsum", "softmax,factors,pv")
# ABLATIONS OF THE TLX BACKWARD (v2 consumers with the dQ split, the default): TIMING ONLY, THEIR RESULTS ARE WRONG.
# Each bit removes one stage of the consumers' query-block loop (attn_bwd.py's ABLATE_*), every barrier and the work
# order kept, so the H200 can say what each stage costs (bench/NOTES.md "TLX backward ablations (helper bwdablate)";
# tools/tlx_check.py backward-ablation): dq: no dQ = dS K wgmma and no reduce-add (staging store, TMA reduce);
# dqadd: the dQ wgmma kept (its result kept alive), no staging store or TMA reduce-add (dQ's traffic alone); exp2:
# P = S * scale - lse without the exp2 (the MUFU work; the FFMA kept); ds: dS = dP, no P (dP - delta) (its FADD /
# FMUL, and delta's load); dk / dv: no dK += dS^T Q / dV += P^T dO wgmma; loads: the producer's Q/dO TMA loads only for the first
# NUM_BUFFERS_Q blocks, then the ring's slots signalled full without loading (the consumers reuse stale tiles).
# Two stand-ins for an MXFP8 backward on Hopper (bench/NOTES.md "MXFP8 backward on Hopper, helper mxbwd, stop 26"):
# mxquant, an added stage: P and dS rounded to their MXFP8 values in registers (P at one fixed scale, dS in 32 x 32
# blocks) before their bf16 stores, the CUDA-core work MX adds; sdphalf: S and dP over half of head_dim, the tensor
# time and operand bytes of E4M3 S and dP wgmma. Both: an MXFP8 backward with FP8 S/dP and bf16 dV/dK/dQ on MX
# values (its extra Q/dO loads aside). Env JFA_TLX_BWD_ABLATE=dq,exp2,... (default none: 0).
# dkvstore (helper bcastbwd39), not a loop stage: the item's dK/dV epilogue stores skipped (dK, dV kept alive), what
# the epilogue costs an item (broadcast-Q: 2 blocks an item). promote (helper mxbcast48; not in the runs below: a
# compile stand-in for the MXFP8 backward's design (A)): dV and dK each into a fresh wgmma accumulator per query block,
# folded into dV / dK by an FFMA (FP8 dV / dK's promotion of the MX scale products: its registers).
BACKWARD_ABLATIONS = {"dq": 1, "dqadd": 2, "exp2": 4, "ds": 8, "dk": 16, "dv": 32, "loads": 64, "mxquant": 128,
                      "sdphalf": 256, "dkvstore": 512, "promote": 1024}


def backward_ablation_mask(names: str) -> int:
    """The ABLATE bits of a comma-separated list of ``BACKWARD_ABLATIONS`` names ("" or "none": 0)."""
    return _ablation_mask(BACKWARD_ABLATIONS, names, "backward")


def backward_ablation_names(mask: int) -> str:
    """``backward_ablation_mask``'s inverse ("none" for 0)."""
    return _ablation_names(BACKWARD_ABLATIONS, mask)


BACKWARD_ABLATE = backward_ablation_mask(os.environ.get("JFA_TLX_BWD_ABLATE", ""))
# What tools/tlx_check.py backward-ablation times (and tools/tlx_compile.py bwd-ablate compiles): one stage at a
# time, then together: the CUDA-core math (exp2,ds), dQ and loads, down to the S/dP/dV/dK wgmma floor.
BACKWARD_ABLATION_RUNS = ("none", "dq", "dqadd", "exp2", "ds", "dk", "dv", "loads", "exp2,ds", "dq,exp2,ds",
                          "dq,exp2,ds,loads", "dq,dk,dv", "mxquant", "sdphalf", "mxquant,sdphalf", "dkvstore")
NUM_WARPS = 4  # the producer (default task); each consumer warpgroup adds 4 (async_task num_warps)


@dataclasses.dataclass(frozen=True)
class FwdConfig:
    block_m: int  # query rows per work item (two consumer half-tiles of block_m // 2)
    block_n: int  # key rows per block
    num_buffers_kv: int  # depth of the key/value ring
    # Consumers software-pipelined: block j's QK^T issued before block j-1's PV (FA3's order), else each block's
    # QK^T, softmax and PV in turn (see fwd_choices). Costs a [64, block_n] probability tile of registers: at D256
    # (128 registers of accumulator) ptxas spilled ~900 B per thread, so D256 never runs pipelined.
    pipeline: bool = True
    num_buffers_q: int = 2  # query half-tile pairs: 2 = the next item's Q loads while this one finishes
    # ONE_LOOP applies (the v4 consumers): not at D256, where ptxas spills 900-1100 B per thread in them (the [64, 256]
    # fp32 accumulator is 128 of the 232 registers; v3 there: 200-232 B)
    one_loop: bool = True


# D64: 2 x 8 KiB Q + 3 x (16 + 16) KiB K/V; D128: 32 + 2 x 64 KiB; D256: 64 + 2 x 64 KiB (smaller key blocks: the
# [64, 256] fp32 accumulator already takes 128 of a consumer's 232 registers). Compiled for sm_90 (ptxas, spill
# bytes stores/loads per thread, since the epilogue's column positions stopped living across the item loop): D64 0;
# D128 unpipelined 0, pipelined (v2) 40 / 40, v4 8-84 / 8-104; D256 unpipelined 92-104 / 108-128.
_FWD = {64: FwdConfig(128, 128, 3), 128: FwdConfig(128, 128, 2, pipeline=False),
        256: FwdConfig(128, 64, 2, pipeline=False, num_buffers_q=1, one_loop=False)}


# The MXFP8 forward (mxfp8_attn_fwd.py, v3 consumers): E4M3 tiles are half the bytes, so three K/V buffers
# (D128: 2 x 2 x 8 KiB Q + 3 x (16 + 16) KiB K and V^T = 128 KiB).
_MXFP8_FWD = {64: FwdConfig(128, 128, 3, pipeline=False, one_loop=False),
              128: FwdConfig(128, 128, 3, pipeline=False, one_loop=False)}


def mxfp8_fwd_config(head_dim: int) -> Optional[FwdConfig]:
    """The MXFP8 forward's config, None for head dims it does not run (the triton MXFP8 forward does)."""
    return _MXFP8_FWD.get(head_dim)


def fwd_config(head_dim: int) -> Optional[FwdConfig]:
    """The forward's config, None for head dims the TLX kernels do not cover (the triton backend runs those)."""
    return _FWD.get(head_dim)


def fwd_choices(cfg: FwdConfig, masked: bool, broadcast_q: bool, uniform: bool):
    """(pipeline, kv_major, one_loop) for one call (one_loop: the v4 consumers where the config allows them, per
    ``ONE_LOOP``; it overrides pipeline), from static
    facts: ``masked`` (causal or a window: tile costs vary within a sequence), ``broadcast_q``, ``uniform`` (every
    sequence has the same length, known from the shapes and the max_seqlen hints).

    H200 runs 1-2 (bf16 D128 forward TFLOP/s; bench/NOTES.md "TLX forward"):
    - pipelined consumers lost to unpipelined on causal (dense 372 vs 408), GQA (437 vs 474), window (194 vs 228),
      jagged (471 vs 489) and won on broadcast-Q (244 vs 179) and D64 (392 vs 378): ptxas spills 100-170 B per
      thread in the pipelined D128 kernel. So: pipelined at D64 and for broadcast-Q up to D128.
    - work order: kv-head-major (programs side by side share a kv head's K/V in the L2) won on dense (554 vs 507;
      causal 461 vs 408; D256 586 vs 528); tile-major (static striding longest-first over the whole list) won on
      jagged causal (407 vs 372) and window (228 vs 159). So: kv-major unless costs vary (masked or broadcast-Q)
      over sequences of different lengths."""
    pipeline = cfg.pipeline or (broadcast_q and cfg.block_n == 128 and cfg.num_buffers_q == 2)
    kv_major = uniform or not (masked or broadcast_q)
    one_loop = not broadcast_q if ONE_LOOP is None else ONE_LOOP
    return ((pipeline if PIPELINE is None else PIPELINE), (kv_major if KV_MAJOR is None else KV_MAJOR),
            one_loop and cfg.one_loop)


@dataclasses.dataclass(frozen=True)
class BwdConfig:
    block_m: int  # query rows per streamed block
    block_n: int  # keys per work item (two consumer halves of block_n // 2)
    num_buffers_q: int  # depth of the Q/dO ring
    num_buffers_dq: int  # fp32 dQ staging buffers per consumer (TMA reduce-add sources)
    dq_split: int = 1  # dQ = dS K computed in this many column slices (fewer registers live at once)
    dq_shared: bool = False  # v2: each consumer computes dQ for one column half (dq_split 2) over both halves' keys


# dK and dV of 64 keys stay in a consumer's registers (2 x [64, D] fp32): D256 does not fit (the triton backward runs
# it). v2 (bench/NOTES.md "TLX backward v2"): shared memory at D128: K, V 64 KiB + 2 x (Q + dO) 64 KiB + P, dS 32 KiB +
# dQ staging 2 x 2 x [64, 64] fp32 64 KiB = 224 KiB (dK/dV leave through the K/V tiles: a register layout change would
# take 16 KiB more). dQ in two column slices at D128: in one piece (32 more registers live at its wait) ptxas spilled
# 400 / 500 B per thread (full) instead of 140 / 180.
_BWD_V2 = {64: BwdConfig(64, 128, 2, 2), 128: BwdConfig(64, 128, 2, 2, dq_split=2)}


# dq_shared: dS double-buffered (+16 KiB), one [64, D/2] fp32 staging buffer per consumer (-48 KiB at D128).
_BWD_V2_DQ_SHARED = {64: BwdConfig(64, 128, 2, 1, dq_split=2, dq_shared=True),
                     128: BwdConfig(64, 128, 2, 1, dq_split=2, dq_shared=True)}


def stats_ahead(head_dim: int) -> bool:
    """Whether the v2 backward prefetches the next block's lse/delta (``BACKWARD_STATS_AHEAD``; unset: D64 only)."""
    return head_dim <= 64 if BACKWARD_STATS_AHEAD is None else BACKWARD_STATS_AHEAD


def backward_options(head_dim: int, heads_kv: int) -> dict:
    """The dense TLX backward's switches as set here: ``attn_bwd.attention_backward``'s keywords (the default
    backward and the MXFP8 one, ``mxfp8_attn_bwd.py``, take them from one place)."""
    return dict(dq_shared=BACKWARD_DQ_SHARED,
                stats_ahead=stats_ahead(head_dim), head_group=head_group(heads_kv),
                item_order=BACKWARD_ITEM_ORDER, causal_order=BACKWARD_CAUSAL_ORDER,
                causal_jagged=BACKWARD_CAUSAL_ORDER_JAGGED,
                ablate=BACKWARD_ABLATE,  # 0 unless timing stages (wrong results)
                gqa_split=BACKWARD_GQA_SPLIT,
                kv_early=BACKWARD_KV_EARLY, peel=BACKWARD_PEEL, stats_smem=BACKWARD_STATS_SMEM,
                store_tma=BACKWARD_STORE_TMA)


def bwd_config_v2(head_dim: int, dq_shared: bool = False) -> Optional[BwdConfig]:
    """The backward's config (``dq_shared``: ``BACKWARD_DQ_SHARED``), None where the triton
    backend's backward runs instead. Shared memory at D128 (bytes): dq_shared 213,384."""
    return (_BWD_V2_DQ_SHARED if dq_shared else _BWD_V2).get(head_dim)


def sparse_reason(head_dim: int, block_q: int, block_kv: int) -> Optional[str]:
    """None when the block-sparse forward runs a selection of block_q x block_kv blocks at ``head_dim``, else why
    not (the triton backend runs it): it runs the v4 consumers (not at D256), a work item's query tile lies in one Q
    block, a selected block is whole key tiles."""
    cfg = fwd_config(head_dim)
    if cfg is None or not cfg.one_loop:
        return f"head_dim {head_dim}: the block-sparse forward runs head_dim 64 and 128"
    if block_q % cfg.block_m or block_kv % cfg.block_n:
        return (f"block_q {block_q} and block_kv {block_kv} must be multiples of {cfg.block_m} and {cfg.block_n} "
                f"(the query and key tiles at head_dim {head_dim})")
    return None


def sparse_backward_reason(head_dim: int, block_q: int, block_kv: int) -> Optional[str]:
    """None when the block-sparse backward (the v2 backward with SPARSE) runs a selection of block_q x block_kv
    blocks at ``head_dim``, else why not (the triton sparse backward runs it): a selected block is whole query blocks
    (64 rows) and whole key tiles (128 keys)."""
    cfg = bwd_config_v2(head_dim, True)
    if cfg is None:
        return f"head_dim {head_dim}: the block-sparse backward runs head_dim 64 and 128"
    if block_q % cfg.block_m or block_kv % cfg.block_n:
        return (f"block_q {block_q} and block_kv {block_kv} must be multiples of {cfg.block_m} and {cfg.block_n} "
                f"(the backward's query block and key tile at head_dim {head_dim})")
    return None
