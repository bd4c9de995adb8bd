"""Tile lists built on the device, longest first, for the persistent kernels. No host sync anywhere.

A *tile* is (sequence id, first row of the stationary side) for one block of ``block`` rows of one sequence. The
number of real tiles depends on the lengths (device data), so the list has a length bounded by shapes alone::

    sum_b cdiv(L_b, block) <= cdiv(T, block) + B

and the real count stays on the device (``count``, a 1-element int32 tensor the kernels read). Entries past the real
count are padding (seq = -1, start = 0, cost -1: sorted last) and are never visited.

Order: descending estimated cost (visible pairs of the tile), so that the persistent grid's static striding hands the
longest tiles out first and the short ones fill in at the end (greedy longest-processing-time-first). Ties keep
(sequence, start) order.

Cost on the host: three launches per list (``tile_slots_kernel``, one stable sort, one gather), whatever B is; the
slot of a tile comes from the offsets directly (no prefix sum over the lengths), see ``tile_slots_kernel``. When every
work item of the list runs at once (``one_wave``: items <= programs the GPU holds at a time, decided from shapes), the
order cannot matter and no list is built: the kernels map their work item to its slot themselves (``slot_tile``) and
skip padding slots (``tile_schedule`` chooses).

Offset checks (``JFA_VALIDATE=async|deferred``) ride along: ``tile_slots_kernel`` (or the forward kernel, when there
is no list) checks both offsets tensors and writes one flag; the list is empty when they are bad, and ``slot_tile``
never yields a tile outside the tensors, so bad offsets make no kernel read or write out of bounds.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from ..base import capturing, per_trace, reusable_in_eager, stream_key, tracing
from .common import cdiv, int_max, launch_schedule, loop_bound, num_sms, work_item
from .configs import KNOBS
from .launch import launch
from .offset_checks import offsets_ok

SLOT_CHUNK = 1024  # tile slots per program of tile_slots_kernel
# Lists of at most this many slots are ordered by rank_tiles_kernel (one launch, capacity^2 compares spread over the
# grid), longer ones by torch.sort + index_select. H200, model suite T=32768: the sorts cost 0.32 ms a step, ~27 us
# each for ~550 slots (bench/NOTES.md v7).
RANK_MAX_SLOTS = 16384
RANK_BLOCK, RANK_CHUNK = 32, 256  # slots ranked per program x slots compared per step


@dataclasses.dataclass
class TileList:
    seq: torch.Tensor  # [capacity] int32: first sequence of the tile (-1: padding)
    start: torch.Tensor  # [capacity] int32: first stationary row of the tile, relative to its sequence
    count: torch.Tensor  # [1] int32: number of real tiles (device scalar)
    capacity: int  # shape-derived upper bound on count (host int)


@triton.jit
def slot_tile(OFF_S, OFF_O, t, num_seqs, search_steps, rows_s, rows_o, BLOCK: tl.constexpr):
    """(sequence, first stationary row, real) of tile slot ``t`` (scalar) in ``tile_slots_kernel``'s slot layout.
    real is False for padding slots and for a sequence whose offsets point outside the tensors (bad offsets under
    JFA_VALIDATE=deferred reach the kernels: they must skip, never read or write out of bounds)."""
    base = tl.load(OFF_S) // BLOCK
    lo = t * 0  # invariant as in tile_slots_kernel: g(lo) <= t < g(hi)
    hi = lo + num_seqs
    for _ in range(0, loop_bound(search_steps)):
        mid = (lo + hi) // 2
        active = hi - lo > 1  # steps past the answer (search_steps is a bound) read nothing and change nothing
        go_right = tl.load(OFF_S + mid, mask=active, other=0) // BLOCK - base + mid <= t
        lo = tl.where(active & go_right, mid, lo)
        hi = tl.where(active & (~go_right), mid, hi)
    return _slot_extent(OFF_S, OFF_O, t, lo, base, rows_s, rows_o, BLOCK)


@triton.jit
def _slot_extent(OFF_S, OFF_O, t, seq, base, rows_s, rows_o, BLOCK: tl.constexpr):
    """(seq, first stationary row, real) of slot t found to lie in sequence seq's slots (``slot_tile``)."""
    begin_s = tl.load(OFF_S + seq)
    end_s = tl.load(OFF_S + seq + 1)
    begin_o = tl.load(OFF_O + seq)
    end_o = tl.load(OFF_O + seq + 1)
    start = (t - (begin_s // BLOCK - base + seq)) * BLOCK
    real = (start >= 0) & (start < end_s - begin_s) & (begin_s >= 0) & (end_s <= rows_s) & (begin_o >= 0) \
        & (begin_o <= end_o) & (end_o <= rows_o)
    return seq, start.to(tl.int32), real


SEARCH_FANOUT: tl.constexpr = tl.constexpr(64)  # candidates per step of fanout_sequence's search


@triton.jit
def fanout_sequence(OFFSETS, target, num_seqs, base, BLOCK: tl.constexpr, SEARCH_STEPS: tl.constexpr):
    """The largest b in [0, num_seqs) with OFFSETS[b] // BLOCK - base + b <= target (0 when none: bad offsets
    still give a sequence in range), by a 64-ary search (``fanout_search_steps``): each step loads 64 candidate
    offsets at once, so a batch of <= 64**steps sequences costs ``SEARCH_STEPS`` dependent loads, not
    ceil(log2 B) (each a memory latency before a program's first data load; the H200 measured the MXFP8 quantize
    kernel at 36% of HBM with a binary search, bench/NOTES.md "MXFP8 v3"). Serves both slot layouts: the tile
    lists' (base = OFFSETS[0] // BLOCK, ``tile_slots_kernel``) and the MXFP8 kernels' (base 0)."""
    lo = target * 0  # invariant: g(lo) <= target (g(0) <= 0), the answer in [lo, lo + width * SEARCH_FANOUT)
    j = tl.arange(0, SEARCH_FANOUT)
    for level in tl.static_range(SEARCH_STEPS):
        width = 1
        for _ in tl.static_range(SEARCH_STEPS - 1 - level):
            width *= SEARCH_FANOUT
        cand = lo + j * width
        ok = cand < num_seqs
        g = tl.load(OFFSETS + cand, mask=ok, other=0) // BLOCK - base + cand
        lo += (tl.maximum(tl.sum((ok & (g <= target)).to(tl.int32), 0), 1) - 1) * width  # g increases: a prefix
    return lo


@triton.jit
def padded_tile(OFFSETS, tile, num_seqs, BLOCK: tl.constexpr, SEARCH_STEPS: tl.constexpr):
    """(sequence, first row (int64), length, first row of the tile within the sequence) of ``tile`` in the MXFP8
    kernels' padded layout, where sequence b's tiles are numbered from OFFSETS[b] // BLOCK + b (one spare tile per
    sequence, so the count is T // BLOCK + B on the host, with no sync). The tile start may be >= the length: a
    padding tile, which the caller skips."""
    seq = fanout_sequence(OFFSETS, tile, num_seqs, 0, BLOCK, SEARCH_STEPS)
    row0 = tl.load(OFFSETS + seq).to(tl.int64)
    length = (tl.load(OFFSETS + seq + 1) - row0).to(tl.int32)
    start = (tile - (row0 // BLOCK + seq)).to(tl.int32) * BLOCK
    return seq, row0, length, start


@triton.jit
def rows_inside(row0, length, rows):
    """Whether a sequence's rows [row0, row0 + length) lie in [0, rows) (row0 int64). The MXFP8 kernels' padded
    tiles skip a sequence that fails it: bad offsets (JFA_VALIDATE=deferred lets them reach the kernels) give garbage
    outputs, never an access outside the tensors. Scalar work once per program."""
    return (row0 >= 0) & (length >= 0) & (row0 + length <= rows)


@triton.jit
def padded_tile_keys(keys, n0, row0, length, rows):
    """Which of ``keys`` (positions within the sequence, tile start ``n0`` + columns) of a ``padded_tile`` exist: 0 <=
    key < length, and none where the sequence lies outside [0, rows) (``rows_inside``) or the tile is padding. Keys
    below 0 come from a tile search that fell back to sequence 0 on bad offsets (a first offset past the rows)."""
    end = tl.where((n0 >= 0) & rows_inside(row0, length, rows), length, 0)
    return (keys >= 0) & (keys < end)


def padded_tiles(total: int, num_seqs: int, block: int) -> int:
    """Tiles of ``padded_tile``'s layout for ``total`` rows in ``num_seqs`` sequences (one spare a sequence)."""
    return total // block + num_seqs


@triton.jit
def slot_tile_fanout(OFF_S, OFF_O, t, num_seqs, rows_s, rows_o, BLOCK: tl.constexpr, SEARCH_STEPS: tl.constexpr):
    """``slot_tile`` with the sequence found by ``fanout_sequence``: a batch of <= 64 sequences costs one dependent
    load before the extents, not ceil(log2 B)."""
    base = tl.load(OFF_S) // BLOCK
    seq = fanout_sequence(OFF_S, t, num_seqs, base, BLOCK, SEARCH_STEPS)
    return _slot_extent(OFF_S, OFF_O, t, seq, base, rows_s, rows_o, BLOCK)


@triton.jit
def work_tile(work, n_tiles, num_heads, group, TILE_SEQ, TILE_START, OFF_S, OFF_O, num_seqs, search_steps, rows_s,
              rows_o, BLOCK: tl.constexpr, KV_MAJOR: tl.constexpr, TILES_FROM_OFFSETS: tl.constexpr):
    """(sequence, first stationary row, head, real) of work item ``work`` of a work-list kernel: its (tile, head) by
    ``common.work_item``, the tile from the sorted list (TILE_SEQ/TILE_START), or under TILES_FROM_OFFSETS (one
    wave, ``tile_schedule``) from its unsorted slot (``slot_tile``; real is False for padding slots)."""
    tile, head = work_item(work, n_tiles, num_heads, group, KV_MAJOR)
    if TILES_FROM_OFFSETS:
        seq, start, real = slot_tile(OFF_S, OFF_O, tile, num_seqs, search_steps, rows_s, rows_o, BLOCK)
    else:
        seq, start, real = tl.load(TILE_SEQ + tile), tl.load(TILE_START + tile), tile >= 0
    return seq, start, head, real


@triton.jit(do_not_specialize=["num_seqs", "capacity", "search_steps", "lo_off", "hi_off", "rows_s", "rows_o",
                               "max_s", "max_o", "sel_heads", "sel_blocks", "stride_sb", "stride_sh"])
def tile_slots_kernel(OFF_S, OFF_O, SLOTS, COST, TILE_COUNT, FLAG, SEL_COUNT, num_seqs, capacity, search_steps,
                      lo_off, hi_off, rows_s, rows_o, max_s, max_o, sel_heads, sel_blocks, stride_sb, stride_sh,
                      BLOCK: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, CHECK: tl.constexpr,
                      CHUNK: tl.constexpr, SEL_BLOCK: tl.constexpr):
    """Unsorted tile slots: SLOTS[0, t] = sequence (-1: padding), SLOTS[1, t] = first row, COST[t] (-1: padding);
    TILE_COUNT = number of real tiles, 0 when the offsets are bad (rows_*: each side's row count; max_*: its
    max_seqlen, < 0 for none); CHECK: also FLAG = 1 when they are good, else 0. SLOTS is [2, capacity] int32,
    COST [capacity] int64. SEL_BLOCK > 0: a real tile's cost is instead the blocks its block (start // SEL_BLOCK)
    selected, summed over the heads of a block-sparse selection's count SEL_COUNT [B, sel_heads, sel_blocks]
    (0 past sel_blocks): ``build_tiles``' ``selected``.

    Sequence b owns the slots [g(b), g(b + 1)) with ``g(b) = off[b] // BLOCK - off[0] // BLOCK + b``: that range holds
    at least cdiv(L_b, BLOCK) slots (floor(end/BLOCK) - floor(begin/BLOCK) + 1 >= cdiv(end - begin, BLOCK)), and
    g(B) <= T // BLOCK + B <= capacity. Its tile j sits at slot g(b) + j; the rest of its range is padding. g is
    strictly increasing, so slot t belongs to the last b with g(b) <= t: a binary search over the offsets
    (``search_steps`` = ceil(log2 B) halvings), with no prefix sum and no cross-program dependency. Slot order is
    (sequence, start) order, so a stable sort by cost keeps that order among ties.
    """
    pid = tl.program_id(0)
    t = pid * CHUNK + tl.arange(0, CHUNK)
    in_range = t < capacity
    base = tl.load(OFF_S) // BLOCK
    lo = tl.zeros([CHUNK], tl.int32)  # invariant: g(lo) <= t < g(hi) (g(num_seqs) read as +infinity)
    hi = lo + num_seqs
    for _ in range(0, loop_bound(search_steps)):
        mid = (lo + hi) // 2
        active = hi - lo > 1
        g = tl.load(OFF_S + mid, mask=active, other=0) // BLOCK - base + mid
        go_right = g <= t
        lo = tl.where(active & go_right, mid, lo)
        hi = tl.where(active & (~go_right), mid, hi)
    seq = lo
    begin = tl.load(OFF_S + seq)
    len_s = (tl.load(OFF_S + seq + 1) - begin).to(tl.int64)
    len_o = (tl.load(OFF_O + seq + 1) - tl.load(OFF_O + seq)).to(tl.int64)
    j = t - (begin // BLOCK - base + seq)  # tile index within the sequence
    real = in_range & (j.to(tl.int64) * BLOCK < len_s)
    start = j.to(tl.int64) * BLOCK
    rows = tl.minimum(len_s - start, BLOCK)
    diag = len_o - len_s
    vis_lo = tl.zeros([CHUNK], tl.int64)
    vis_hi = len_o
    if HAS_LO:
        vis_lo = tl.maximum(start + tl.cast(lo_off, tl.int64) + diag, 0)
    if HAS_HI:
        # tl.cast, not .to: torch's mutation analysis (generate_ttir, torch 2.11) may pass a scalar as a constant int
        vis_hi = tl.minimum(start + rows + tl.cast(hi_off, tl.int64) + diag, len_o)  # last row + hi_off + diag + 1
    if SEL_BLOCK > 0:
        block = start // SEL_BLOCK
        has_row = real & (block < sel_blocks)
        row = SEL_COUNT + seq.to(tl.int64) * stride_sb + block
        selected = tl.zeros([CHUNK], tl.int64)
        for h in range(0, loop_bound(sel_heads)):
            selected += tl.load(row + h * stride_sh, mask=has_row, other=0).to(tl.int64)
        cost = tl.where(real, selected, -1)
    else:
        cost = tl.where(real, rows * tl.maximum(vis_hi - vis_lo, 0), -1)
    tl.store(SLOTS + t, tl.where(real, seq, -1), mask=in_range)
    tl.store(SLOTS + capacity + t, tl.where(real, start, 0).to(tl.int32), mask=in_range)
    tl.store(COST + t, cost, mask=in_range)
    if pid == 0:  # the real count (sum of cdiv(L_b, BLOCK)), and the offset checks
        total = tl.zeros([CHUNK], tl.int32)
        for b0 in range(0, loop_bound(num_seqs), CHUNK):
            b = b0 + tl.arange(0, CHUNK)
            ok = b < num_seqs
            n = tl.load(OFF_S + b + 1, mask=ok, other=0) - tl.load(OFF_S + b, mask=ok, other=0)
            total += (n + BLOCK - 1) // BLOCK
        valid = offsets_ok(OFF_S, num_seqs, rows_s, max_s, CHUNK) & offsets_ok(OFF_O, num_seqs, rows_o, max_o, CHUNK)
        tl.store(TILE_COUNT, tl.where(valid, tl.sum(total, 0), 0))
        if CHECK:
            tl.store(FLAG, valid.to(tl.int32))


def capacity_of(total_rows: int, block: int, num_seqs: int) -> int:
    """Slots of a tile list (an upper bound on its tiles), rounded up to 4 so that the second row of the
    [2, capacity] slots stays 16-byte aligned whatever the lengths (launch.py keys on pointer alignment)."""
    return -(-((total_rows + block - 1) // block + num_seqs) // 4) * 4


MAX_SEARCH_STEPS = 31  # halvings that find any of < 2**31 sequences


def binary_search_steps(num_seqs) -> int:
    """Halvings of the binary searches over ``num_seqs`` sequences (ceil(log2 B)). A symbolic B (torch.compile with
    dynamic shapes) gets the bound for any int32 batch instead: the kernels' extra steps are masked no-ops, and no
    guard (no recompile) depends on B."""
    return max(num_seqs - 1, 0).bit_length() if isinstance(num_seqs, int) else MAX_SEARCH_STEPS


def fanout_search_steps(num_seqs) -> int:
    """Steps of ``fanout_sequence``'s search over ``num_seqs`` sequences (a constexpr: the fewest with
    64**steps >= num_seqs); a symbolic B gets the bound for any int32 batch (6), as ``binary_search_steps``."""
    if not isinstance(num_seqs, int):
        return 6
    steps = 1
    while SEARCH_FANOUT.value ** steps < num_seqs:
        steps += 1
    return steps


def one_wave(max_items: int, programs_per_sm: int, device: torch.device) -> bool:
    """Every item runs at once (at most the programs the GPU holds at a time: ``programs_per_sm`` is a lower bound
    on a config's occupancy): then the order of the list cannot matter. From shapes only, never a sync. With
    symbolic sizes (torch.compile, dynamic shapes) True only when it holds for every size, so that no guard (no
    recompile) depends on the lengths: a traced call whose size is not bounded builds the sorted list (unless
    ``KNOBS.traced_sorted_lists`` is off)."""
    fits = max_items <= num_sms(device) * programs_per_sm
    if isinstance(fits, bool):
        return fits
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(fits) or not KNOBS.traced_sorted_lists


@triton.jit(do_not_specialize=["capacity"])
def rank_tiles_kernel(SLOTS, COST, ORDERED, capacity, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    """ORDERED[:, r] = SLOTS[:, i], r = slot i's place in a stable descending sort by COST (what torch.sort(cost,
    descending=True, stable=True) + index_select give): r = #{j: cost_j > cost_i} + #{j < i: cost_j == cost_i}.
    Every rank is distinct, so each column of ORDERED is written once. SLOTS/ORDERED [2, capacity] int32."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < capacity
    cost_i = tl.load(COST + i, mask=ok, other=-1)
    rank = tl.zeros([BLOCK], tl.int32)
    for j0 in range(0, loop_bound(capacity), CHUNK):
        j = j0 + tl.arange(0, CHUNK)
        cost_j = tl.load(COST + j, mask=j < capacity, other=-2)  # below padding's -1: never ahead of any slot
        ahead = (cost_j[None, :] > cost_i[:, None]) | ((cost_j[None, :] == cost_i[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum(ahead.to(tl.int32), axis=1)
    tl.store(ORDERED + rank, tl.load(SLOTS + i, mask=ok), mask=ok)
    tl.store(ORDERED + capacity + rank, tl.load(SLOTS + capacity + i, mask=ok), mask=ok)


def build_tiles(stationary_offsets: torch.Tensor, other_offsets: torch.Tensor, rows_s: int, rows_o: int, block: int,
                lo_off: int, hi_off: int, has_lo: bool, has_hi: bool, flag=None, max_s: int = -1,
                max_o: int = -1, cost_of=None, selected=None) -> TileList:
    """Tiles over the stationary side (queries for forward/dQ, keys for dK/dV), longest first.

    A stationary position ``s`` of a sequence sees the other side's positions ``o`` with
    ``s + lo_off + diag <= o <= s + hi_off + diag`` with ``diag = L_other - L_stationary`` (each bound only if
    present; the bottom-right alignment of FlashAttention), clipped to ``[0, L_other)``. The tile cost is (rows in
    the tile) x (other-side positions its rows can see). Offsets: [B + 1] int32 (int64 works, another compile).
    ``flag``: a [1] int32 tensor the offset check writes (1: valid); rows_*/max_*: what the offsets are checked
    against (the list is empty when they are bad, flag or not). ``cost_of(seq, start)``: another cost per tile
    (int64 tensors of the slots' sequence and first row; padding slots have seq -1), e.g. the selected blocks of a
    block-sparse tile (``block_sparse_fwd.selected_cost``: ~8 torch ops); ``selected=(count, block)``: that cost
    read inside ``tile_slots_kernel`` instead (a block-sparse selection's count [B, H, N] or its transpose's, and
    its row block: the blocks a tile's block selected, summed over the heads; ``KNOBS.sparse_list_cost_in_kernel``).
    Still sorted on the device, no sync. While traced, a list of offsets and ints alone is built once per graph
    (``base.per_trace``: every layer, and the backward, read the first one; a checked build serves the unchecked).
    """
    if cost_of is None and selected is None:
        # The max hints come with the flag only (the check's bounds) and stay out of the key with it: keyed, a
        # checked build with the call's max_seqlen missed every later unchecked call (hints -1), and each graph
        # built the list twice whenever max_seqlen was given (layer 1, then layers 2.. and the dQ list).
        checked = {} if flag is None else dict(flag=flag, max_s=max_s, max_o=max_o)
        return per_trace(_build_tiles, stationary_offsets, other_offsets, rows_s, rows_o, block, lo_off, hi_off,
                         has_lo, has_hi, **checked)
    return _build_tiles(stationary_offsets, other_offsets, rows_s, rows_o, block, lo_off, hi_off, has_lo, has_hi,
                        max_s, max_o, flag, cost_of, selected)


@reusable_in_eager  # a model's layers pass one offsets tensor: one list a step, not one a call (base.per_trace)
def _build_tiles(stationary_offsets, other_offsets, rows_s, rows_o, block, lo_off, hi_off, has_lo, has_hi,
                 max_s=-1, max_o=-1, flag=None, cost_of=None, selected=None) -> TileList:
    device = stationary_offsets.device
    num_seqs = other_offsets.numel() - 1
    capacity = capacity_of(rows_s, block, num_seqs)
    if num_seqs <= 0:
        return _padding_tiles(capacity, device)
    slots = torch.empty((2, capacity), dtype=torch.int32, device=device)  # unsorted (seq, start)
    cost = torch.empty((capacity,), dtype=torch.int64, device=device)
    count = torch.empty((1,), dtype=torch.int32, device=device)
    sel_count, sel_block = selected if selected is not None else (count, 0)
    sel_shape = sel_count.shape if selected is not None else (1, 1, 1)
    launch(tile_slots_kernel, (cdiv(capacity, SLOT_CHUNK),), dict(
        OFF_S=stationary_offsets, OFF_O=other_offsets, SLOTS=slots, COST=cost, TILE_COUNT=count,
        FLAG=count if flag is None else flag, SEL_COUNT=sel_count, num_seqs=num_seqs, capacity=capacity,
        search_steps=binary_search_steps(num_seqs), lo_off=lo_off, hi_off=hi_off, rows_s=rows_s, rows_o=rows_o,
        max_s=max_s, max_o=max_o, sel_heads=sel_shape[1], sel_blocks=sel_shape[2],
        stride_sb=sel_count.stride(0) if selected is not None else 0,
        stride_sh=sel_count.stride(1) if selected is not None else 0, BLOCK=block, HAS_LO=has_lo, HAS_HI=has_hi,
        CHECK=flag is not None, CHUNK=SLOT_CHUNK, SEL_BLOCK=sel_block), num_warps=4, num_stages=1)
    if cost_of is not None:  # the caller's cost of the real tiles (padding keeps -1: last)
        cost = torch.where(cost >= 0, cost_of(slots[0], slots[1]), cost)
    if (KNOBS.traced_rank_tiles if tracing() else isinstance(capacity, int) and capacity <= RANK_MAX_SLOTS):
        ordered = torch.empty((2, capacity), dtype=torch.int32, device=device)
        launch(rank_tiles_kernel, (cdiv(capacity, RANK_BLOCK),), dict(
            SLOTS=slots, COST=cost, ORDERED=ordered, capacity=capacity, BLOCK=RANK_BLOCK, CHUNK=RANK_CHUNK),
            num_warps=4, num_stages=1)
        seq, start = ordered
    else:  # long lists, and traced graphs unless KNOBS.traced_rank_tiles (no size-dependent choice, no guard)
        order = torch.sort(cost, descending=True, stable=True).indices  # ties (and the padding) keep slot order
        seq, start = slots.index_select(1, order)
    return TileList(seq, start, count, capacity)


def forward_tiles(q_offsets: torch.Tensor, kv_offsets: torch.Tensor, total_q: int, total_kv: int, block_m: int,
                  window_left: int, right: int, has_left: bool, has_right: bool, **check) -> TileList:
    """Query tiles. Row i sees keys j with i + diag - window_left <= j <= i + diag + right, diag = L_k - L_q."""
    return build_tiles(q_offsets, kv_offsets, total_q, total_kv, block_m, -window_left, right, has_left, has_right,
                       **check)


def kv_tiles(q_offsets: torch.Tensor, kv_offsets: torch.Tensor, total_q: int, total_kv: int, block_n: int,
             window_left: int, right: int, has_left: bool, has_right: bool, **extra) -> TileList:
    """Key tiles. Key j is seen by rows i with j - diag - right <= i <= j - diag + window_left (diag = L_k - L_q)."""
    return build_tiles(kv_offsets, q_offsets, total_kv, total_q, block_n, -right, window_left, has_right, has_left,
                       **extra)


def tiles_from_offsets(max_items: int, num_seqs: int, programs_per_sm: int, device: torch.device) -> bool:
    """``tile_schedule``'s choice from shapes: no sorted list, the kernel maps items to slots from the offsets."""
    return KNOBS.one_wave_unsorted and one_wave(max_items, programs_per_sm, device) and num_seqs > 0


def tile_schedule(tiles_fn, stationary_offsets: torch.Tensor, other_offsets: torch.Tensor, rows_s: int,
                  rows_o: int, block: int, heads: int, kind: str, programs_per_sm: int, device: torch.device,
                  **check):
    """(programs, the scheduling arguments of a work-loop kernel) for tiles of ``block`` stationary rows x ``heads``.

    One wave (``one_wave``, ``KNOBS.one_wave_unsorted``): no list, the kernel maps items to slots itself
    (TILES_FROM_OFFSETS; the pointers are placeholders); else ``tiles_fn()`` builds the sorted list (with the offset
    check in ``check`` folded into it)."""
    num_seqs = other_offsets.numel() - 1
    capacity = capacity_of(rows_s, block, num_seqs)
    from_offsets = tiles_from_offsets(capacity * heads, num_seqs, programs_per_sm, device)
    if from_offsets:
        seq = start = count = stationary_offsets
    else:
        tiles = tiles_fn(**check)
        seq, start, count, capacity = tiles.seq, tiles.start, tiles.count, tiles.capacity
    programs, counter = launch_schedule(kind, capacity * heads, programs_per_sm, device)
    return programs, dict(TILE_SEQ=seq, TILE_START=start, TILE_COUNT=count,
                          WORK_COUNTER=count if counter is None else counter, n_slots=capacity,
                          search_steps=binary_search_steps(num_seqs), num_seqs=int_max(num_seqs, 0),
                          rows_s=rows_s, rows_o=rows_o, ATOMIC_WORK=counter is not None,
                          TILES_FROM_OFFSETS=from_offsets)


SCHEDULE_FLAGS = ("ATOMIC_WORK", "TILES_FROM_OFFSETS")  # the constexprs of a schedule (``tile_schedule``)


def schedule_arguments(schedule: dict) -> dict:
    """A schedule's per-call arguments (tile list tensors, counts): everything but its constexprs, which belong in a
    launch plan's key (``launch.launch_planned``)."""
    return {name: value for name, value in schedule.items() if name not in SCHEDULE_FLAGS}


# ------------------------------------------------------------------------------ lists that depend on shapes only
def shape_constant(fn):
    """Memoize a pure function of host ints and a trailing ``device`` that builds read-only device tensors (tile
    lists of broadcast Q, arange offsets): one set of small launches per shape instead of per call. Never use it for
    anything that reads device data. Kept per CUDA stream (``base.stream_key``: made on one stream, they are ordered
    before that stream's reads only). Bypassed during CUDA graph capture (a tensor made there holds garbage until
    the graph replays); while tracing, once per graph instead (the tensors are the graph's, and sizes may be
    symbolic)."""

    @functools.lru_cache(maxsize=64)
    def cached(*args_and_stream):  # the stream keys the entry only
        return fn(*args_and_stream[:-1])

    @functools.wraps(fn)
    def wrapper(*args):
        device = torch.device(args[-1])
        if tracing():  # sizes may be symbolic, and the tensors are the graph's: once per graph (base.per_trace)
            return per_trace(fn, *args)
        if capturing(device):
            return fn(*args)
        return cached(*args[:-1], device, stream_key(device))

    wrapper.cache_clear = cached.cache_clear
    return wrapper


@shape_constant
def _padding_tiles(capacity: int, device: torch.device) -> TileList:
    return TileList(torch.full((capacity,), -1, dtype=torch.int32, device=device),
                    torch.zeros((capacity,), dtype=torch.int32, device=device),
                    torch.zeros((1,), dtype=torch.int32, device=device), capacity)


@shape_constant
def single_tiles(num_tiles: int, block: int, device: torch.device) -> TileList:
    """Tiles 0..num_tiles-1 of one block each (seq 0), e.g. query blocks of a broadcast Q; no sort needed."""
    ids = torch.arange(num_tiles, device=device, dtype=torch.int32)
    return TileList(torch.zeros_like(ids), ids * block, torch.full((1,), num_tiles, device=device,
                                                                    dtype=torch.int32), num_tiles)


def narrow_keys(groups: int, bound: int) -> bool:
    """Whether ``grouped_order``'s keys (group, within) with group < ``groups`` and |within| <= ``bound`` fit int32
    (``block_sparse_bwd.sectioned_item_list_device`` packs its keys by the same rule)."""
    return groups > 0 and bound > 0 and groups * (2 * bound + 1) < (1 << 31) - 1


def grouped_order(real: torch.Tensor, group: torch.Tensor, within: torch.Tensor, groups: int = 0, bound: int = 0):
    """The stable permutation (new position -> old) that takes the items group after group (int64 ``group``,
    ascending), each group by ascending ``within`` (|within| < 2**31), the padding items (not ``real``) last.
    ``groups`` > group and ``bound`` >= |within| of the real items, when given, make the keys int32 where they fit
    (the same order: (group, within) -> group * (2 bound + 1) + within + bound is monotone, padding above them all);
    a radix sort's passes go by the key's bits."""
    if narrow_keys(groups, bound):
        key = torch.where(real, group * (2 * bound + 1) + within + bound, (1 << 31) - 1).to(torch.int32)
    else:
        key = torch.where(real, group * (1 << 32) + within, 1 << 62)
    return torch.sort(key, stable=True).indices


def stream_sections(seq: torch.Tensor, head: torch.Tensor, real: torch.Tensor, heads_kv: int,
                     q_offsets: torch.Tensor, bytes_per_row: int, l2_bytes: int):
    """(section, longest_first) per item (int64, bool): the items' (sequence, kv head) streams taken longest
    sequence first (stable: ties in (seq, head) order) and packed into sections whose query-side rows
    (``bytes_per_row`` each) fill ``l2_bytes`` (a stream larger than that is a section alone); ``longest_first``
    alternates from section to section, True in the last (the snake's turns: ``block_sparse_bwd.zigzag_groups``'
    rule). Padding items (not ``real``: seq -1) get section 0."""
    lengths = (q_offsets[1:] - q_offsets[:-1]).to(torch.int64).clamp(min=0)
    by_length = torch.sort(lengths.repeat_interleave(heads_kv), descending=True, stable=True).indices
    stream_bytes = lengths.repeat_interleave(heads_kv)[by_length] * bytes_per_row
    filled = torch.cumsum(stream_bytes, 0) - stream_bytes  # bytes of the streams before each one
    section_of = torch.empty_like(by_length)
    section_of[by_length] = filled // l2_bytes
    section = torch.where(real, section_of[(seq.clamp(min=0).long() * heads_kv + head).clamp(max=max(
        section_of.numel() - 1, 0))], 0)
    longest_first = (section_of.max() - section) % 2 == 0 if section_of.numel() else section == section
    return section, longest_first
