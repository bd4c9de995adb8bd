"""Stage 2 forward on the device: each work item owns BLOCK_M query rows of one (sequence, q head) and runs the
dense kernel's online-softmax step (``attn_fwd.fwd_step``: ``common.softmax_step``, masks by ``common.visible``)
over the key tiles of the KV blocks its Q block selected, and nothing else: unselected blocks are never loaded.

Work: the dense forward's work list (``scheduling.tile_schedule``: query tiles x q heads, longest first, built on
the device), ordered here by the tile's selected-block count (``selected_cost_args``) instead of its visible
keys. Query
tile m0 lies in Q block m0 // BLOCK_Q (BLOCK_M divides BLOCK_Q); Q blocks past the selection's rows select nothing
(out 0, lse -inf).

Masks, as the dense kernel's stages (``common.stage_bounds``): the selected key tiles (ascending, as
``select_kv_blocks`` returns them) split into a masked lead (tiles below the mask-free bulk: window start), the
mask-free bulk and a masked tail (diagonal, window end, the sequence's partial last block, ids past the sequence);
``selected_tiles_split`` finds both split points in one vector pass over the ids, and each part runs in its own
loop with MASKED a constexpr.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import common
from .attn_fwd import broadcast_offsets, fwd_step, rows_descriptor, store_out_lse, use_tma
from .common import (dot_precision, first_work, head_dim_consts, load_rows, loop_bound, next_work, packed_rows,
                     query_row0, row_source, row_strides, seq_extent, stage_bounds, window_bounds)
from .configs import KNOBS, get_config
from .launch import launch
from .scheduling import forward_tiles, tile_schedule, work_tile

IDS_CHUNK: tl.constexpr = tl.constexpr(64)  # selected ids read per step of selected_tiles_below


@triton.jit
def selected_blocks(BLOCK_INDEX, BLOCK_COUNT, seq, head, block, n_blocks, stride_ib, stride_ih, stride_in, stride_cb,
                    stride_ch):
    """(pointer to the first selected id, count) of row (seq, head, block) of a selection (or of its transpose);
    rows past the index (block >= n_blocks) select nothing."""
    seq64 = (head * 0 + seq).to(tl.int64)  # seq may be a loop counter (a plain int under the interpreter)
    row = BLOCK_INDEX + seq64 * stride_ib + head * stride_ih + block * stride_in
    count = tl.load(BLOCK_COUNT + seq64 * stride_cb + head * stride_ch + block, mask=block < n_blocks, other=0)
    return row, count


@triton.jit
def selected_tiles_split(ids, count, lead_limit, bulk_limit, BLOCK: tl.constexpr, TILE: tl.constexpr,
                         ONE_PASS: tl.constexpr):
    """(lead end, bulk end): how many of the selected tiles (the TILE-row tiles of the ``count`` blocks of BLOCK rows
    listed at ``ids``, in list order) end at or below ``lead_limit``, and at or below ``bulk_limit`` (multiples of
    TILE). With ascending ids they come first, so these are the stage split points for lead_limit = bulk_begin,
    bulk_limit = bulk_end. Negative ids count as below everything (the masked lead, where the loop masks them
    whole); ids past the sequence as above. ONE_PASS (``KNOBS.sparse_one_pass_split``): one pass over the ids for
    both (a work item's first tile waits on it), else one pass each."""
    if ONE_PASS:
        lead = count * 0
        bulk = count * 0
        for j0 in range(0, loop_bound(count), IDS_CHUNK):
            used, first = _ids_chunk(ids, j0, count, BLOCK)
            lead += tl.sum(tl.where(used, _tiles_below(lead_limit, first, BLOCK, TILE), 0), 0)
            bulk += tl.sum(tl.where(used, _tiles_below(bulk_limit, first, BLOCK, TILE), 0), 0)
    else:
        lead = _selected_tiles_below(ids, count, lead_limit, BLOCK, TILE)
        bulk = _selected_tiles_below(ids, count, bulk_limit, BLOCK, TILE)
    return lead, bulk


@triton.jit
def _selected_tiles_below(ids, count, limit, BLOCK: tl.constexpr, TILE: tl.constexpr):
    below = count * 0
    for j0 in range(0, loop_bound(count), IDS_CHUNK):
        used, first = _ids_chunk(ids, j0, count, BLOCK)
        below += tl.sum(tl.where(used, _tiles_below(limit, first, BLOCK, TILE), 0), 0)
    return below


@triton.jit
def _ids_chunk(ids, j0, count, BLOCK: tl.constexpr):
    """(used, first row of each block) of selected ids j0 .. j0 + IDS_CHUNK - 1 (used: j < count)."""
    j = j0 + tl.arange(0, IDS_CHUNK)
    used = j < count
    return used, tl.load(ids + j, mask=used, other=0) * BLOCK


@triton.jit
def _tiles_below(limit, first, BLOCK: tl.constexpr, TILE: tl.constexpr):
    """How many TILE-row tiles of a BLOCK-row block starting at ``first`` end at or below ``limit``: floor((limit -
    first) / TILE) clamped to [0, BLOCK // TILE]."""
    return tl.minimum(tl.maximum(limit - first, 0) // TILE, BLOCK // TILE)


@triton.jit
def selected_tile_range(ids, count, key_begin, key_end, BLOCK: tl.constexpr, TILE: tl.constexpr, width=None,
                        split_begin=None, split_end=None):
    """(first, n): the TILE-row tiles of the ``count`` selected blocks of BLOCK rows listed at ``ids`` (tile t: the
    (t % per-block)-th TILE rows of block ids[t // per-block]) that overlap keys [key_begin, key_end) are tiles
    first .. first + n - 1. With ascending ids they are contiguous: negative ids and tiles below key_begin come
    before them, tiles at or past key_end after. key_begin a multiple of TILE (``stage_bounds``' lead_begin);
    key_end <= the sequence's keys (its hi_any), so every tile of the range starts inside the sequence and only the
    last one may run past its end. One pass over the ids (the TLX forward's walk, ``tlx/attn_fwd.py``).

    ``width`` (the row's entries, all readable): the first IDS_CHUNK ids are read masked by it, not by the count, so
    that read waits on nothing the count's does (the loop's trip count waits for the count): one dependent read less
    where the count is loaded just before (the TLX forward's WALK_AHEAD). The same (first, n).

    ``split_begin`` / ``split_end`` (the mask-free bulk [bulk_begin, bulk_end), multiples of TILE; the TLX forward's
    PEEL): (first, n, n_lead, n_unmasked) from the same pass: of the walk's tiles, the first n_lead start below
    split_begin (a masked lead), tiles n_lead .. n_unmasked - 1 lie inside [split_begin, split_end) (mask-free) and
    the rest end past split_end (a masked tail): with ascending ids, exactly the tiles a per-tile test ``(n0 <
    split_begin) | (n0 + TILE > split_end)`` masks. 0 <= n_lead <= n_unmasked <= n."""
    if width is None:
        sums = (count * 0,) * (2 if split_begin is None else 4)
        j_from = 0
    else:
        j = tl.arange(0, IDS_CHUNK)
        start = tl.load(ids + j, mask=j < width, other=0) * BLOCK
        sums = _tile_sums(j < count, start, key_begin, key_end, split_begin, split_end, BLOCK, TILE)
        j_from = IDS_CHUNK
    for j0 in range(j_from, loop_bound(count), IDS_CHUNK):
        used, start = _ids_chunk(ids, j0, count, BLOCK)
        sums = _add_sums(sums, _tile_sums(used, start, key_begin, key_end, split_begin, split_end, BLOCK, TILE))
    if split_begin is None:
        return sums
    else:
        first, n, lead, unmasked = sums
        # row-relative counts (tiles ending at or below each limit) to walk-relative ones; tiles below split_begin
        # but at or past key_end (a band narrower than a tile) are no part of the walk: the clamps
        n_lead = tl.minimum(tl.maximum(lead - first, 0), n)
        n_unmasked = tl.minimum(tl.maximum(unmasked - first, n_lead), n)
        return first, n, n_lead, n_unmasked


@triton.jit
def _tile_sums(used, start, key_begin, key_end, split_begin, split_end, BLOCK: tl.constexpr, TILE: tl.constexpr):
    """``selected_tile_range``'s sums over one chunk of ids: (first, n), with ``split_begin`` also the tiles ending
    at or below split_begin / split_end (``_tile_split_part``)."""
    if split_begin is None:
        return _tile_range_part(used, start, key_begin, key_end, BLOCK, TILE)
    else:
        return _tile_split_part(used, start, key_begin, key_end, split_begin, split_end, BLOCK, TILE)


@triton.jit
def _add_sums(a, b):
    """Two chunks' ``_tile_sums`` added, element by element (2 or 4 of them)."""
    if len(a) == 2:
        return a[0] + b[0], a[1] + b[1]
    else:
        return _add4(a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3])


@triton.jit
def _tile_range_part(used, start, key_begin, key_end, BLOCK: tl.constexpr, TILE: tl.constexpr):
    """``selected_tile_range``'s (first, n) over one chunk of ids (``used``: listed; ``start``: each block's first
    key)."""
    below = _tiles_below(key_begin, start, BLOCK, TILE)  # this block's tiles below key_begin
    inside = _tiles_below(key_end + TILE - 1, start, BLOCK, TILE)  # ... starting below key_end
    return tl.sum(tl.where(used, below, 0), 0), tl.sum(tl.where(used, tl.maximum(inside - below, 0), 0), 0)


@triton.jit
def _add4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _tile_split_part(used, start, key_begin, key_end, split_begin, split_end, BLOCK: tl.constexpr,
                     TILE: tl.constexpr):
    """``selected_tile_range``'s split form over one chunk of ids: (first, n) as ``_tile_range_part`` and the tiles
    ending at or below split_begin / split_end, summed in one multi-operand reduction."""
    below = _tiles_below(key_begin, start, BLOCK, TILE)
    inside = _tiles_below(key_end + TILE - 1, start, BLOCK, TILE)
    return tl.reduce((tl.where(used, below, 0), tl.where(used, tl.maximum(inside - below, 0), 0),
                      tl.where(used, _tiles_below(split_begin, start, BLOCK, TILE), 0),
                      tl.where(used, _tiles_below(split_end, start, BLOCK, TILE), 0)), 0, _add4)


@triton.jit
def selected_tile_start(ids, t, BLOCK: tl.constexpr, TILE: tl.constexpr, valid=None):
    """First key of selected tile t (see ``selected_tile_range``); ``valid`` False: 0, nothing read (a tile past the
    walk, read ahead)."""
    TILES: tl.constexpr = BLOCK // TILE
    if valid is None:
        block = tl.load(ids + t // TILES)
    else:
        block = tl.load(ids + t // TILES, mask=valid, other=0)
    return block * BLOCK + (t % TILES) * TILE


@triton.jit
def selected_walk(BLOCK_INDEX, BLOCK_COUNT, real, seq, head, s0, n_blocks, stride_ib, stride_ih, stride_in, stride_cb,
                  stride_ch, other_begin, other_end, BLOCK_S: tl.constexpr, BLOCK_O: tl.constexpr,
                  TILE_O: tl.constexpr, ROW_WIDTH: tl.constexpr = False, split_begin=None, split_end=None):
    """(first, n): the walk of the stationary tile at s0 of (seq, head) over a selection whose rows belong to blocks
    of BLOCK_S stationary positions and list blocks of BLOCK_O other-side positions (the selection itself for the
    query-stationary forward, its transpose for the key-stationary backward): tiles first .. first + n - 1 of
    BLOCK_INDEX seen as one list of TILE_O-row tiles (``selected_tile_start(BLOCK_INDEX, t, BLOCK_O, TILE_O)``), those
    of row s0 // BLOCK_S that overlap [other_begin, other_end) (``selected_tile_range``: other_begin a multiple of
    TILE_O, other_end inside the sequence). Rows past n_blocks and padding items (not ``real``) walk nothing.
    ``first`` is one int32 for the row's position too (the TLX kernels keep it live across their block loop, where a
    64-bit row pointer cost registers): the host checks the index has < 2^31 tiles. ROW_WIDTH: the rows are
    contiguous, so stride_in is their width (``selected_tile_range``'s ``width``: the first ids read beside the
    count). ``split_begin`` / ``split_end`` given: (first, n, n_lead, n_unmasked), ``selected_tile_range``'s split of
    the walk at the mask-free bulk (the TLX forward's PEEL)."""
    block = s0 // BLOCK_S
    count = tl.load(BLOCK_COUNT + seq * stride_cb + head * stride_ch + block, mask=real & (block < n_blocks),
                    other=0)  # a padding slot's s0 may be anything: it selects nothing
    row = seq * stride_ib + head * stride_ih + block * stride_in
    walk = selected_tile_range(BLOCK_INDEX + row, count, other_begin, other_end, BLOCK_O, TILE_O,
                               stride_in if ROW_WIDTH else None, split_begin, split_end)
    return (row * (BLOCK_O // TILE_O) + walk[0],) + walk[1:]  # first: the row's position added


@triton.jit
def _fwd_selected_tiles(acc, m_i, l_i, q, k_src, v_src, stride_kt, stride_vt, kv_row0, kv_col, ids, rows, cols, d_ok,
                        len_q, len_k, lo_off, hi_off, qk_scale, t_begin, t_end, bulk_begin, bulk_end,
                        BLOCK_N: tl.constexpr, BLOCK_KV: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,
                        MASKED: tl.constexpr, PAD_D: tl.constexpr, USE_TMA: tl.constexpr,
                        DOT_PRECISION: tl.constexpr, FMA_SOFTMAX: tl.constexpr):
    """Online-softmax update over selected key tiles [t_begin, t_end) (tile t: the (t % per-block)-th BLOCK_N keys
    of block ids[t // per-block]). Mask-free (not MASKED): the tiles lie in [bulk_begin, bulk_end); the clamp only
    keeps unsorted ids (a broken contract) inside the sequence. USE_TMA: k_src/v_src are tensor descriptors over
    [T_kv, Hkv*D] read at (kv_row0 + n0, kv_col), as in the dense forward (a masked tile may reach into the next
    sequence's rows: masked scores, zeroed V)."""
    TILES_PER_BLOCK: tl.constexpr = BLOCK_KV // BLOCK_N
    for t in range(loop_bound(t_begin), loop_bound(t_end)):
        block = tl.load(ids + t // TILES_PER_BLOCK)
        n0 = block * BLOCK_KV + (t % TILES_PER_BLOCK) * BLOCK_N
        if MASKED:
            n0 = tl.where((block >= 0) & (n0 < len_k), n0, len_k)  # ids outside the sequence: a fully masked tile
        else:
            n0 = tl.minimum(tl.maximum(n0, bulk_begin), bulk_end - BLOCK_N)
        acc, m_i, l_i = fwd_step(acc, m_i, l_i, q, k_src, v_src, stride_kt, stride_vt, kv_row0, kv_col, n0, rows, cols,
                                 d_ok, len_q, len_k, lo_off, hi_off, qk_scale, HAS_LO, HAS_HI, MASKED, PAD_D, USE_TMA,
                                 DOT_PRECISION, FMA_SOFTMAX, True)
    return acc, m_i, l_i


@triton.jit
def _sparse_fwd_tile(Q, K, V, Out, Lse, Q_OFF, KV_OFF, BLOCK_INDEX, BLOCK_COUNT, seq, m0, head, total_out,
                     n_q_blocks, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot,
                     stride_oh, stride_ib, stride_ih, stride_in, stride_cb, stride_ch, group, qk_scale, window_left,
                     right, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr,
                     HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BROADCAST_Q: tl.constexpr,
                     USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr, FMA_SOFTMAX: tl.constexpr,
                     ONE_PASS_SPLIT: tl.constexpr):
    """One work item: query rows [m0, m0 + BLOCK_M) of sequence ``seq``, q head ``head``."""
    out_row0, len_q = seq_extent(tl.load(Q_OFF + seq), tl.load(Q_OFF + seq + 1))
    kv_row0, len_k = seq_extent(tl.load(KV_OFF + seq), tl.load(KV_OFF + seq + 1))
    q_row0 = query_row0(out_row0, BROADCAST_Q)
    rows = m0 + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    rows_ok = rows < len_q
    q = load_rows(Q + (q_row0 + rows)[:, None] * stride_qt + head * stride_qh + d[None, :], rows_ok, d_ok, True, PAD_D)
    kv_head = head // group
    k_src = row_source(K, kv_row0, cols, stride_kt, kv_head, stride_kh, d, USE_TMA)
    v_src = row_source(V, kv_row0, cols, stride_vt, kv_head, stride_vh, d, USE_TMA)
    kv_col = kv_head * HEAD_DIM
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    _, _, bulk_begin, bulk_end, _, _ = stage_bounds(m0, len_q, len_k, -window_left, right, HAS_LEFT, HAS_RIGHT,
                                                    BLOCK_M, BLOCK_N)
    ids, count = selected_blocks(BLOCK_INDEX, BLOCK_COUNT, seq, kv_head, m0 // BLOCK_Q, n_q_blocks, stride_ib,
                                 stride_ih, stride_in, stride_cb, stride_ch)
    lead_end, bulk_stop = selected_tiles_split(ids, count, bulk_begin, bulk_end, BLOCK_KV, BLOCK_N, ONE_PASS_SPLIT)
    # masked lead (window start), mask-free bulk, masked tail (diagonal, window end, partial last block)
    acc, m_i, l_i = _fwd_selected_tiles(acc, m_i, l_i, q, k_src, v_src, stride_kt, stride_vt, kv_row0, kv_col, ids,
                                        rows, cols, d_ok, len_q, len_k, -window_left, right, qk_scale, 0, lead_end, bulk_begin,
                                        bulk_end, BLOCK_N, BLOCK_KV, HAS_LEFT, HAS_RIGHT, True, PAD_D, USE_TMA,
                                        DOT_PRECISION, FMA_SOFTMAX)
    acc, m_i, l_i = _fwd_selected_tiles(acc, m_i, l_i, q, k_src, v_src, stride_kt, stride_vt, kv_row0, kv_col, ids,
                                        rows, cols, d_ok, len_q, len_k, -window_left, right, qk_scale, lead_end, bulk_stop,
                                        bulk_begin, bulk_end, BLOCK_N, BLOCK_KV, HAS_LEFT, HAS_RIGHT, False, PAD_D,
                                        USE_TMA, DOT_PRECISION, FMA_SOFTMAX)
    acc, m_i, l_i = _fwd_selected_tiles(acc, m_i, l_i, q, k_src, v_src, stride_kt, stride_vt, kv_row0, kv_col, ids,
                                        rows, cols, d_ok, len_q, len_k, -window_left, right, qk_scale, bulk_stop,
                                        count * (BLOCK_KV // BLOCK_N), bulk_begin, bulk_end, BLOCK_N, BLOCK_KV,
                                        HAS_LEFT, HAS_RIGHT, True, PAD_D, USE_TMA, DOT_PRECISION, FMA_SOFTMAX)
    # Rows that saw no key: out 0 and lse -inf (as the dense kernel).
    store_out_lse(Out, Lse, acc, m_i, l_i, out_row0, rows, head, total_out, stride_ot, stride_oh, d, rows_ok, d_ok,
                  PAD_D)


@triton.jit(do_not_specialize=["num_heads", "total_out", "n_q_blocks", "n_slots", "search_steps", "num_seqs",
                               "rows_s", "rows_o", "group", "window_left", "right"])
def block_sparse_fwd_kernel(Q, K, V, Out, Lse, Q_OFF, KV_OFF, BLOCK_INDEX, BLOCK_COUNT, TILE_SEQ, TILE_START,
                            TILE_COUNT, WORK_COUNTER, num_heads, total_out, n_q_blocks, n_slots, search_steps,
                            num_seqs, rows_s, rows_o, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt,
                            stride_vh, stride_ot, stride_oh, stride_ib, stride_ih, stride_in, stride_cb, stride_ch,
                            group, qk_scale, window_left, right,
                            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_Q: tl.constexpr,
                            BLOCK_KV: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                            BROADCAST_Q: tl.constexpr, USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr,
                            FMA_SOFTMAX: tl.constexpr, KV_MAJOR: tl.constexpr, ATOMIC_WORK: tl.constexpr,
                            TILES_FROM_OFFSETS: tl.constexpr, ONE_PASS_SPLIT: tl.constexpr):
    """Work items (query tile, q head), as the dense ``attn_fwd_kernel`` takes them (``scheduling.work_tile``).
    USE_TMA: K and V are tensor descriptors over [T_kv, Hkv*D] (block [BLOCK_N, HEAD_DIM])."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # fp64 when Inductor launches it (a Python float): keep fp32 math
    tl.static_assert(BLOCK_Q % BLOCK_M == 0)
    tl.static_assert(BLOCK_KV % BLOCK_N == 0)
    if TILES_FROM_OFFSETS:
        n_tiles = n_slots
    else:
        n_tiles = tl.load(TILE_COUNT)  # real tile count lives on the device: no host sync
    work = first_work(WORK_COUNTER if ATOMIC_WORK else None, ATOMIC_WORK)
    while work < n_tiles * num_heads:
        seq, m0, head, real = work_tile(work, n_tiles, num_heads, group, TILE_SEQ, TILE_START, Q_OFF, KV_OFF,
                                        num_seqs, search_steps, rows_s, rows_o, BLOCK_M, KV_MAJOR,
                                        TILES_FROM_OFFSETS)
        if real:
            _sparse_fwd_tile(Q, K, V, Out, Lse, Q_OFF, KV_OFF, BLOCK_INDEX, BLOCK_COUNT, seq, m0, head, total_out,
                             n_q_blocks, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot,
                             stride_oh, stride_ib, stride_ih, stride_in, stride_cb, stride_ch, group, qk_scale,
                             window_left, right, HEAD_DIM, BLOCK_D, PAD_D, BLOCK_M, BLOCK_N, BLOCK_Q, BLOCK_KV,
                             HAS_LEFT, HAS_RIGHT, BROADCAST_Q, USE_TMA, DOT_PRECISION, FMA_SOFTMAX, ONE_PASS_SPLIT)
        work = next_work(work, WORK_COUNTER if ATOMIC_WORK else None, ATOMIC_WORK)


def tile_sizes(kernel: str, head_dim: int, dtype: torch.dtype, causal: bool, device, block_q: int, block_kv: int):
    """(config, BLOCK_M, BLOCK_N): the dense kernel's config, its tiles clamped to the selection's blocks."""
    cfg = get_config(kernel, head_dim, dtype, causal, device)
    return cfg, min(cfg.block_m, block_q), min(cfg.block_n, block_kv)


def sparse_offsets(q, q_offsets, kv_offsets, broadcast_q: bool):
    """(q_off, kv_off, total_out) as int32 the kernels read: a broadcast Q's output rows b * L_q + i."""
    num_seqs = kv_offsets.shape[0] - 1
    if broadcast_q:
        return broadcast_offsets(num_seqs, q.shape[0], q.device), kv_offsets.to(torch.int32), num_seqs * q.shape[0]
    return q_offsets.to(torch.int32), kv_offsets.to(torch.int32), q.shape[0]


def index_strides(index_name: str, count_name: str, index: torch.Tensor, count: torch.Tensor) -> dict:
    """The strides of a selection (index [B, H, N, W], count [B, H, N], both with unit last stride) as the kernels
    name them (``stride_<index_name>b/h/n``, ``stride_<count_name>b/h``), taken together."""
    return {f"stride_{index_name}b": index.stride(0), f"stride_{index_name}h": index.stride(1),
            f"stride_{index_name}n": index.stride(2), f"stride_{count_name}b": count.stride(0),
            f"stride_{count_name}h": count.stride(1)}


def longest_rows(x: torch.Tensor, max_seqlen: int, broadcast: bool = False) -> int:
    """A bound on any sequence's rows of ``x`` from shapes and hints only (it sizes the grid): a broadcast Q's rows,
    else the max_seqlen hint when given, else all rows."""
    if broadcast or max_seqlen < 0:
        return max(1, x.shape[0])
    return max(1, min(max_seqlen, x.shape[0]))


def selected_cost(count: torch.Tensor, block: int):
    """``build_tiles``'s cost_of for a selection's count [B, H, N] (or its transpose's): a tile's cost is the blocks
    its block selected, summed over the heads. Tiles past the index's N blocks cost 0 (they select nothing)."""
    per_block = torch.nn.functional.pad(count.sum(1), (0, 1))  # [B, N + 1] int64

    def cost_of(seq: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return per_block[seq.clamp(min=0).long(), (start // block).clamp(max=count.shape[2]).long()]
    return cost_of


def selected_cost_args(count: torch.Tensor, block: int) -> dict:
    """``build_tiles``' block-sparse cost: read in its kernel (``KNOBS.sparse_list_cost_in_kernel``) or by the
    torch ops of ``selected_cost``; the same numbers."""
    if KNOBS.sparse_list_cost_in_kernel:
        return dict(selected=(count, block))
    return dict(cost_of=selected_cost(count, block))


def block_sparse_forward(q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count, params):
    q, k, v = packed_rows(q), packed_rows(k), packed_rows(v)
    device, num_seqs = q.device, kv_offsets.shape[0] - 1
    num_heads, head_dim = q.shape[1], q.shape[2]
    q_off, kv_off, total_out = sparse_offsets(q, q_offsets, kv_offsets, params.broadcast_q)
    out = common.alloc_output((total_out, num_heads, head_dim), q.dtype, device)
    lse = common.alloc_output((num_heads, total_out), torch.float32, device)
    n_q_blocks = kv_block_index.shape[2]
    if total_out == 0 or num_seqs == 0:
        return out, lse
    cfg, block_m, block_n = tile_sizes("fwd", head_dim, q.dtype, params.causal and not KNOBS.sparse_causal_fwd_wide,
                                       device, params.block_q, params.block_kv)
    has_left, window_left, has_right, right = window_bounds(params.causal, params.window_left, params.window_right)
    index, count = kv_block_index.contiguous(), kv_block_count.contiguous()
    # query tiles x q heads, longest first by selected blocks (the dense forward's list, another cost)
    programs, schedule = tile_schedule(
        lambda: forward_tiles(q_off, kv_off, total_out, k.shape[0], block_m, window_left, right, has_left, has_right,
                              **selected_cost_args(count, params.block_q)),
        q_off, kv_off, total_out, k.shape[0], block_m, num_heads, KNOBS.fwd_schedule, cfg.programs_per_sm, device)
    hd = head_dim_consts(head_dim)
    tma = KNOBS.sparse_tma and use_tma(hd["PAD_D"], k, v)
    k_arg, v_arg = (rows_descriptor(k, block_n), rows_descriptor(v, block_n)) if tma else (k, v)
    launch(block_sparse_fwd_kernel, (programs,), dict(
        Q=q, K=k_arg, V=v_arg, Out=out, Lse=lse, Q_OFF=q_off, KV_OFF=kv_off, BLOCK_INDEX=index, BLOCK_COUNT=count,
        **schedule, num_heads=num_heads, total_out=total_out, n_q_blocks=n_q_blocks, **row_strides("q", q),
        **row_strides("k", k), **row_strides("v", v), **row_strides("o", out),
        **index_strides("i", "c", index, count), group=num_heads // k.shape[1],
        qk_scale=params.scale * 1.4426950408889634,  # / ln 2
        window_left=window_left, right=right, **hd, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_Q=params.block_q, BLOCK_KV=params.block_kv, HAS_LEFT=has_left, HAS_RIGHT=has_right,
        BROADCAST_Q=params.broadcast_q, USE_TMA=tma, DOT_PRECISION=dot_precision(q.dtype),
        FMA_SOFTMAX=KNOBS.fwd_fma_softmax and params.scale > 0, KV_MAJOR=KNOBS.fwd_kv_major,
        ONE_PASS_SPLIT=KNOBS.sparse_one_pass_split),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out, lse
