"""TLX forward kernel (sm_90): persistent, warp-specialized, two consumer warpgroups ping-ponging query tiles.

Roles inside one program (12 warps):
- the producer (the default task, 4 warps, few registers) issues TMA loads: per work item the two query half-tiles
  ([BLOCK_M / 2, D] each, one per consumer), then the key/value blocks through a ring of NUM_BUFFERS_KV buffers
  guarded by mbarriers (full: the TMA landed; empty: both consumers are done with it);
- two consumer warpgroups (4 warps each, 232 registers) own one query half-tile each and run the online softmax.
  Named barriers 9/10 make them issue their QK^T wgmma in turn, so one's softmax overlaps the other's matmuls (FA3's
  ping-pong). ``configs.ONE_LOOP`` (off by default) runs the v4 consumers instead (``_consume_tile_one_loop``: one
  loop over a tile's blocks, block j's QK^T in flight with block j-1's PV, FA3's intra-warpgroup overlap).

Work list: the triton backend's device-side tile list (``triton.scheduling.tile_schedule``: longest first, or the
one-wave slot mapping), items (tile, q head) in kv-head-major order (``triton.common.work_item``), program p of P
takes p, p + P, ... (static persistent striding); ``configs.FORWARD_ZIGZAG`` (masked or jagged calls by default):
items in ``triton.common.zigzag_item``'s order over head groups, taken by the snake (``triton.common.snake_work``);
ATOMIC_WORK (``configs.forward_dynamic``: D256 calls by default; the v3 consumers only): the producer takes each
item, longest first, from an atomic counter and hands its index to the consumers with its Q slot (``_hand_work``,
``_read_work``). The producer and the consumers walk the same items and compute the same key-block ranges
(``triton.common.stage_bounds``: masked lead, mask-free bulk, masked tail; blocks nobody sees are never loaded), so
their barrier phases stay in step without talking.

Jagged TMA: the descriptors cover the whole packed [T, H*D] tensors, so a block can run past its sequence's end into
the next sequence. Keys there are masked (-inf) in the masked stages; the value rows there are zeroed in shared memory
before use (consumer 0 does it, then both meet at named barrier 11), because p = 0 times a NaN/inf value of the
neighbour would still poison the output (the triton kernels' rule, commit d131e1a). Outputs are stored through masked
pointer stores, never TMA, so rows past a sequence are never written.

Block-sparse attention (``block_sparse_forward``, constexpr SPARSE, v4 consumers): the same kernel, each item walking
only the key tiles of the KV blocks its Q block selected (``_selected_item``: one pass over the selection row gives a
contiguous range of tiles, all starting inside the sequence; the producer TMA-loads them by id).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from ... import validation
from ..triton import common
from ..triton import launch as launcher
from ..triton.attn_fwd import replay_key as triton_replay_key
from ..triton.attn_fwd import kernel_offsets, keep_replay, replayed, rows_descriptor
from ..triton.common import (LN2, key_interval_mask, seq_extent, snake_items, snake_work, softmax_step,
                             stage_block_start, stage_bounds, visible, window_bounds, work_item, zigzag_item)
from ..triton.block_sparse_fwd import (index_strides, selected_cost_args, selected_tile_start, selected_walk,
                                        sparse_offsets)
from ..triton.launch import launch, launch_planned
from ..triton.scheduling import (capacity_of, forward_tiles, schedule_arguments, slot_tile,
                                 tile_schedule, tiles_from_offsets)
from . import configs
from .configs import NUM_WARPS, fwd_choices, fwd_config

PINGPONG_A: tl.constexpr = tl.constexpr(9)  # consumer 1 -> consumer 0: "your turn to issue"
PINGPONG_B: tl.constexpr = tl.constexpr(10)  # consumer 0 -> consumer 1
VFIX_BARRIER: tl.constexpr = tl.constexpr(11)  # both consumers: the value rows past the sequence end are zeroed
NUM_CONSUMERS: tl.constexpr = tl.constexpr(2)
CONSUMER_REGISTERS: tl.constexpr = tl.constexpr(232)
VFIX_ROWS: tl.constexpr = tl.constexpr(32)  # rows zeroed per step (bounds the registers the fix-up needs)


@triton.jit
def _slot_phase(count, NUM_BUFFERS: tl.constexpr):
    return count % NUM_BUFFERS, (count // NUM_BUFFERS) & 1


@triton.jit
def _n_blocks(begin, end, BLOCK_N: tl.constexpr):
    return (tl.maximum(end - begin, 0) + BLOCK_N - 1) // BLOCK_N


@triton.jit
def _produce_q(desc_q, q_tiles, q_fulls, q_empties, q_count, m0, out_row0, head, HALF_M: tl.constexpr,
               HEAD_DIM: tl.constexpr, ELEMENT_BYTES: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr,
               BROADCAST_Q: tl.constexpr, work_ids=None, work=0, HAND_WORK: tl.constexpr = False):
    """The producer's TMA loads of a work item's query half-tiles (one per consumer) into Q slot ``q_count``
    (shared by the bf16 and the MXFP8 forward); returns the next slot count. HAND_WORK (ATOMIC_WORK): the item's
    work index is written to the slot's ``work_ids`` entry once both consumers freed the slot, before the loads'
    arrivals publish it (``_hand_work``)."""
    if BROADCAST_Q:
        q_row = m0  # every sequence reads the same dense Q
    else:
        q_row = (out_row0 + m0).to(tl.int32)
    q_slot, q_phase = _slot_phase(q_count, NUM_BUFFERS_Q)
    if HAND_WORK:
        for c in tl.static_range(NUM_CONSUMERS):
            tlx.barrier_wait(q_empties[q_slot * NUM_CONSUMERS + c], q_phase ^ 1)
        tlx.local_store(work_ids[q_slot], tl.full([1], work, tl.int32))
    for c in tl.static_range(NUM_CONSUMERS):
        qb = q_slot * NUM_CONSUMERS + c
        if not HAND_WORK:  # (HAND_WORK waited above)
            tlx.barrier_wait(q_empties[qb], q_phase ^ 1)
        tlx.barrier_expect_bytes(q_fulls[qb], HALF_M * HEAD_DIM * ELEMENT_BYTES)
        tlx.async_descriptor_load(desc_q, q_tiles[qb], [q_row + c * HALF_M, head * HEAD_DIM], q_fulls[qb])
    return q_count + 1


@triton.jit
def _hand_work(work_ids, q_fulls, q_empties, q_count, work, NUM_BUFFERS_Q: tl.constexpr):
    """ATOMIC_WORK, the producer: hand a work index to both consumers through Q slot ``q_count`` without loading Q
    (an item without key blocks, or the end mark: an index >= the item count). Returns the next slot count.
    The store is ordered before the arrivals (``barrier_arrive`` syncs the producer's warps, then arrives with
    release semantics) and the consumers read it after their wait (acquire)."""
    q_slot, q_phase = _slot_phase(q_count, NUM_BUFFERS_Q)
    for c in tl.static_range(NUM_CONSUMERS):
        tlx.barrier_wait(q_empties[q_slot * NUM_CONSUMERS + c], q_phase ^ 1)
    tlx.local_store(work_ids[q_slot], tl.full([1], work, tl.int32))
    for c in tl.static_range(NUM_CONSUMERS):
        tlx.barrier_arrive(q_fulls[q_slot * NUM_CONSUMERS + c], 1)
    return q_count + 1


@triton.jit
def _read_work(work_ids, q_fulls, q_count, CID: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr):
    """ATOMIC_WORK, a consumer: the work index the producer handed over in Q slot ``q_count`` (after the slot's
    full barrier: its Q half-tile, if any, has landed too, so the item's own wait for it returns at once)."""
    q_slot, q_phase = _slot_phase(q_count, NUM_BUFFERS_Q)
    tlx.barrier_wait(q_fulls[q_slot * NUM_CONSUMERS + CID], q_phase)
    return tl.max(tlx.local_load(work_ids[q_slot]), 0)


@triton.jit
def _tile_count(TILE_COUNT, n_slots, TILES_FROM_OFFSETS: tl.constexpr):
    """The kernels' tile count: the slots (TILES_FROM_OFFSETS: each program finds its tiles in the offsets), else the
    real count, read on the device (no host sync)."""
    if TILES_FROM_OFFSETS:
        n_tiles = n_slots
    else:
        n_tiles = tl.load(TILE_COUNT)
    return n_tiles


@triton.jit
def _tile_sequence(tile, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, num_seqs, search_steps, rows_s, rows_o,
                   BLOCK: tl.constexpr, TILES_FROM_OFFSETS: tl.constexpr, KEY_TILES: tl.constexpr):
    """(seq, start, real, out_row0, len_q, kv_row0, len_k) of a tile: its sequence, first row (query rows, or key rows
    with KEY_TILES: the backward's tiles), whether it is a real tile (not a padding slot) and the sequence's query and
    key extents. TILES_FROM_OFFSETS: found in the offsets (``slot_tile``), else read from the host's schedule."""
    if TILES_FROM_OFFSETS:
        if KEY_TILES:
            seq, start, real = slot_tile(KV_OFF, Q_OFF, tile, num_seqs, search_steps, rows_s, rows_o, BLOCK)
        else:
            seq, start, real = slot_tile(Q_OFF, KV_OFF, tile, num_seqs, search_steps, rows_s, rows_o, BLOCK)
    else:
        seq = tl.load(TILE_SEQ + tile)
        start = tl.load(TILE_START + tile)
        real = seq >= 0
    seq = tl.maximum(seq, 0)  # padding slots: a harmless sequence to read (nothing runs for them)
    out_row0, len_q = seq_extent(tl.load(Q_OFF + seq), tl.load(Q_OFF + seq + 1))
    kv_row0, len_k = seq_extent(tl.load(KV_OFF + seq), tl.load(KV_OFF + seq + 1))
    return seq, start, real, out_row0, len_q, kv_row0, len_k


@triton.jit
def _work_tile(work, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles, num_heads, group, num_seqs, search_steps,
               rows_s, rows_o, window_left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, TILES_FROM_OFFSETS: tl.constexpr,
               KV_MAJOR: tl.constexpr, head_group=1, ZIGZAG: tl.constexpr = False):
    """Everything producer and consumers both derive from a work item: (real, head, sequence rows, stage bounds,
    sequence). ZIGZAG: the items in ``common.zigzag_item``'s order (else ``work_item``'s, kv-major or tile-major)."""
    if ZIGZAG:
        tile, head = zigzag_item(work, n_tiles, num_heads, group, head_group)
    else:
        tile, head = work_item(work, n_tiles, num_heads, group, KV_MAJOR)
    seq, m0, real, out_row0, len_q, kv_row0, len_k = _tile_sequence(
        tile, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, num_seqs, search_steps, rows_s, rows_o, BLOCK_M, TILES_FROM_OFFSETS,
        False)
    lead_begin, lead_end, bulk_begin, bulk_end, tail_begin, tail_end = stage_bounds(
        m0, len_q, len_k, -window_left, right, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
    return (real, head, m0, out_row0, len_q, kv_row0, len_k, lead_begin, lead_end, bulk_begin, bulk_end,
            tail_begin, tail_end, seq)


@triton.jit
def _warp_uniform(x):
    """x (the same in every lane) through ``redux.sync``, whose result ptxas knows is warp-uniform: values derived
    from it (loop bounds and counters, shared-memory descriptors) can live in uniform registers. The block-sparse
    walks' UNIFORM_WALK (this forward's ``_selected_item``, the backward's ``attn_bwd._selected_rows``): their
    bounds come out of ``selected_walk``'s cross-lane reductions, which ptxas cannot see are uniform."""
    return tl.inline_asm_elementwise("redux.sync.min.s32 $0, $1, 0xffffffff;", "=r,r", [x], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _selected_item(item, BLOCK_INDEX, BLOCK_COUNT, group, n_q_blocks, stride_ib, stride_ih, stride_in, stride_cb,
                   stride_ch, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_N: tl.constexpr,
                   UNIFORM_WALK: tl.constexpr, ROW_WIDTH: tl.constexpr = False, PEEL: tl.constexpr = False):
    """SPARSE: (first, n) of a work item (``_work_tile``'s tuple): it walks the tiles first .. first + n - 1 of
    BLOCK_INDEX seen as one list of BLOCK_N-key tiles (``selected_tile_start(BLOCK_INDEX, t)``), those of its Q
    block's selection row (its kv head's) that overlap the keys any of its rows sees (``selected_tile_range``).
    One int32 for the whole row position (the host checks the index fits): the consumers keep it live across their
    block loop, a 64-bit row pointer cost them registers there. Producer and consumers derive the same
    (``block_sparse_fwd.selected_walk``, which the TLX backward walks its transposed selection with).

    UNIFORM_WALK (``configs.SPARSE_FORWARD_UNIFORM_WALK``): (first, n) through ``_warp_uniform``, the backward's fix
    (helper sparsebwd2). Without it the consumers' block loop counter, K/V ring slot and tile position are per-lane,
    so every wgmma descriptor of the loop is built in vector registers and moved by R2UR (bench/NOTES.md "TLX
    block-sparse forward: uniform walk").

    ROW_WIDTH (WALK_AHEAD): the row's first ids read beside its count (``selected_walk``; ``block_sparse_forward``
    hands the kernel a contiguous index, so the row stride is the row's width).

    PEEL (the consumers' walk with ``configs.SPARSE_FORWARD_PEEL``): (first, n, n_lead, n_unmasked), the walk split
    at the item's mask-free bulk in the same pass over the ids (``selected_tile_range``'s split: tiles 0 .. n_lead - 1
    masked, n_lead .. n_unmasked - 1 mask-free, the rest masked), for ``_consume_tile_one_loop``'s peeled loops."""
    real, head, m0, _, _, _, _, lead_begin, _, bulk_begin, bulk_end, _, tail_end, seq = item
    walk = selected_walk(BLOCK_INDEX, BLOCK_COUNT, real, seq, head // group, m0, n_q_blocks, stride_ib, stride_ih,
                         stride_in, stride_cb, stride_ch, lead_begin, tail_end, BLOCK_Q, BLOCK_KV, BLOCK_N, ROW_WIDTH,
                         bulk_begin if PEEL else None, bulk_end if PEEL else None)
    first, n = _uniform_walk(walk[0], walk[1], UNIFORM_WALK)
    if PEEL:
        n_lead, n_unmasked = _uniform_walk(walk[2], walk[3], UNIFORM_WALK)
        return first, n, n_lead, n_unmasked
    else:
        return first, n


@triton.jit
def _uniform_walk(first, n, UNIFORM_WALK: tl.constexpr):
    """A block-sparse walk's (first, n), through ``_warp_uniform`` when UNIFORM_WALK (forward and backward)."""
    if UNIFORM_WALK:
        first = _warp_uniform(first)
        n = _warp_uniform(n)
    return first, n


@triton.jit
def _produce_blocks(desc_k, desc_v, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, kv_count, kv_row0,
                    kv_col, n_begin, n_end, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                    NUM_BUFFERS_KV: tl.constexpr):
    """TMA loads of the key/value blocks starting at n_begin, n_begin + BLOCK_N, ... < n_end."""
    for n0 in range(n_begin, n_end, BLOCK_N):
        kv_count = _produce_block(desc_k, desc_v, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, kv_count,
                                  (kv_row0 + n0).to(tl.int32), kv_col, BLOCK_N, HEAD_DIM, NUM_BUFFERS_KV)
    return kv_count


@triton.jit
def _produce_selected(desc_k, desc_v, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, kv_count, kv_row0,
                      kv_col, ids, first, n, BLOCK_N: tl.constexpr, BLOCK_KV: tl.constexpr, HEAD_DIM: tl.constexpr,
                      NUM_BUFFERS_KV: tl.constexpr):
    """SPARSE: TMA loads of selected tiles first .. first + n - 1 (``selected_tile_start``). The id is read before
    the wait for a free buffer, so its latency hides behind that wait."""
    for t in range(first, first + n):
        row = (kv_row0 + selected_tile_start(ids, t, BLOCK_KV, BLOCK_N)).to(tl.int32)
        kv_count = _produce_block(desc_k, desc_v, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, kv_count,
                                  row, kv_col, BLOCK_N, HEAD_DIM, NUM_BUFFERS_KV)
    return kv_count


@triton.jit
def _produce_block(desc_k, desc_v, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, kv_count, row, kv_col,
                   BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr):
    """TMA loads of the key and value block at packed row ``row`` into the next ring slot; returns kv_count + 1."""
    block_bytes: tl.constexpr = BLOCK_N * HEAD_DIM * tlx.size_of(tlx.dtype_of(desc_k))
    buf, phase = _slot_phase(kv_count, NUM_BUFFERS_KV)
    tlx.barrier_wait(k_empties[buf], phase ^ 1)
    tlx.barrier_expect_bytes(k_fulls[buf], block_bytes)
    tlx.async_descriptor_load(desc_k, k_tiles[buf], [row, kv_col], k_fulls[buf])
    tlx.barrier_wait(v_empties[buf], phase ^ 1)
    tlx.barrier_expect_bytes(v_fulls[buf], block_bytes)
    tlx.async_descriptor_load(desc_v, v_tiles[buf], [row, kv_col], v_fulls[buf])
    return kv_count + 1


@triton.jit
def _zero_rows_past_end(v_tile, n0, len_k, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr):
    """Zero the rows of a value block (in shared memory) that lie past the sequence's last key."""
    for r in tl.static_range(0, BLOCK_N, CHUNK):
        if n0 + r + CHUNK > len_k:
            part = tlx.local_slice(v_tile, [r, 0], [CHUNK, HEAD_DIM])
            v = tlx.local_load(part)
            # rows relative to the chunk against the rows left: absolute positions (n0 + r + iota) let LLVM widen
            # the loop counter to 64 bits and hoist one 64-bit bound per row out of the loop (spilled registers)
            keep = tl.arange(0, CHUNK) < len_k - n0 - r
            tlx.local_store(part, tl.where(keep[:, None], v, tl.zeros_like(v)))
    tlx.fence_async_shared()  # the wgmma (async proxy) must see these generic-proxy writes


@triton.jit
def _fix_values_past_end(v_tiles, v_fulls, buf, phase, n0, len_k, CID: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_N: tl.constexpr):
    """If key block n0 runs into the next sequence: consumer 0 waits for its value tile (slot buf) and zeroes the
    rows past len_k (the next sequence's), then both consumers meet at VFIX_BARRIER."""
    if n0 + BLOCK_N > len_k:
        if CID == 0:
            tlx.barrier_wait(v_fulls[buf], phase)
            _zero_rows_past_end(v_tiles[buf], n0, len_k, BLOCK_N, HEAD_DIM, VFIX_ROWS)
        tlx.named_barrier_wait(VFIX_BARRIER, 256)


@triton.jit
def _wait_turn(CID: tl.constexpr):
    """Ping-pong: wait until it is this consumer's turn to issue wgmma (consumer 0 first, then 1, alternating)."""
    if CID == 0:
        tlx.named_barrier_wait(PINGPONG_A, 256)
    else:
        tlx.named_barrier_wait(PINGPONG_B, 256)


@triton.jit
def _pass_turn(CID: tl.constexpr):
    """Ping-pong: hand the turn to the other consumer."""
    if CID == 0:
        tlx.named_barrier_arrive(PINGPONG_B, 256)
    else:
        tlx.named_barrier_arrive(PINGPONG_A, 256)


@triton.jit
def _qk(q_tile, k_tile, CID: tl.constexpr):
    """Issue S = Q K^T (async) in ping-pong order: consumer 0 first, then 1, alternating every block."""
    _wait_turn(CID)
    s = tlx.async_dot(q_tile, tlx.local_trans(k_tile))
    _pass_turn(CID)
    return s


@triton.jit
def _softmax(s, m_i, l_i, rows, n0, len_q, len_k, lo_off, hi_off, qk_scale, BLOCK_N: tl.constexpr,
             HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, MASKED: tl.constexpr, FMA_SOFTMAX: tl.constexpr):
    """Online-softmax step on raw scores s of key block n0 (log2 domain): (p, new m, new l, alpha), the mask applied
    first (``common.softmax_step`` the step)."""
    if not FMA_SOFTMAX:
        s = s * qk_scale
    if MASKED:
        keys = n0 + tl.arange(0, BLOCK_N)
        s = tl.where(visible(rows[:, None], keys[None, :], len_q, len_k, lo_off, hi_off, HAS_LO, HAS_HI), s,
                     float("-inf"))
    p, alpha, m_new, l_new = softmax_step(s, m_i, l_i, qk_scale, MASKED, FMA_SOFTMAX)
    return p, m_new, l_new, alpha


@triton.jit
def _consume_blocks(acc, m_i, l_i, kv_count, q_tile, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties,
                    rows, len_q, len_k, lo_off, hi_off, qk_scale, n_begin, n_end, CID: tl.constexpr,
                    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, HAS_LO: tl.constexpr,
                    HAS_HI: tl.constexpr, MASKED: tl.constexpr, FMA_SOFTMAX: tl.constexpr, DTYPE: tl.constexpr):
    """Key blocks [n_begin, n_end), not pipelined: QK^T, softmax, PV, each waited before the next block."""
    for n0 in range(n_begin, n_end, BLOCK_N):
        buf, phase = _slot_phase(kv_count, NUM_BUFFERS_KV)
        if MASKED:  # the block may run into the next sequence (only ever in a masked stage)
            _fix_values_past_end(v_tiles, v_fulls, buf, phase, n0, len_k, CID, HEAD_DIM, BLOCK_N)
        tlx.barrier_wait(k_fulls[buf], phase)
        s = _qk(q_tile, k_tiles[buf], CID)
        s = tlx.async_dot_wait(0, s)
        tlx.barrier_arrive(k_empties[buf], 1)
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, rows, n0, len_q, len_k, lo_off, hi_off, qk_scale, BLOCK_N,
                                      HAS_LO, HAS_HI, MASKED, FMA_SOFTMAX)
        acc = acc * alpha[:, None]
        tlx.barrier_wait(v_fulls[buf], phase)
        acc = tlx.async_dot(p.to(DTYPE), v_tiles[buf], acc)
        acc = tlx.async_dot_wait(0, acc)
        tlx.barrier_arrive(v_empties[buf], 1)
        kv_count += 1
    return acc, m_i, l_i, kv_count


@triton.jit
def _pv_pending(acc, p, prev_n0, prev_count, v_tiles, v_fulls, len_k, CID: tl.constexpr, HEAD_DIM: tl.constexpr,
                BLOCK_N: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, CHECK_END: tl.constexpr):
    """Issue acc += P V for the previous key block (async), after zeroing its value rows past the sequence end
    (CHECK_END: the previous block may run past it; never inside the mask-free bulk, whose blocks are whole and
    follow either nothing or a lead block that did not reach the end)."""
    buf, phase = _slot_phase(prev_count, NUM_BUFFERS_KV)
    if CHECK_END:
        _fix_values_past_end(v_tiles, v_fulls, buf, phase, prev_n0, len_k, CID, HEAD_DIM, BLOCK_N)
    tlx.barrier_wait(v_fulls[buf], phase)
    return tlx.async_dot(p, v_tiles[buf], acc)


@triton.jit
def _consume_blocks_pipelined(acc, m_i, l_i, p, prev_n0, kv_count, q_tile, k_tiles, v_tiles, k_fulls, k_empties,
                              v_fulls, v_empties, rows, len_q, len_k, lo_off, hi_off, qk_scale, n_begin, n_end,
                              CID: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                              NUM_BUFFERS_KV: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,
                              MASKED: tl.constexpr, FMA_SOFTMAX: tl.constexpr, DTYPE: tl.constexpr):
    """Key blocks [n_begin, n_end), software-pipelined (the FA3 order): block j's QK^T is issued, then the previous
    block's PV (p holds its probabilities, prev_n0 its first key, kv_count - 1 its buffer), and block j's softmax
    runs while that PV is in flight. The first block of the tile went through ``_consume_first``."""
    for n0 in range(n_begin, n_end, BLOCK_N):
        buf, phase = _slot_phase(kv_count, NUM_BUFFERS_KV)
        tlx.barrier_wait(k_fulls[buf], phase)
        s = _qk(q_tile, k_tiles[buf], CID)
        acc = _pv_pending(acc, p, prev_n0, kv_count - 1, v_tiles, v_fulls, len_k, CID, HEAD_DIM, BLOCK_N,
                          NUM_BUFFERS_KV, MASKED)
        s = tlx.async_dot_wait(1, s)  # QK^T done; the PV may still run
        tlx.barrier_arrive(k_empties[buf], 1)
        p_new, m_i, l_i, alpha = _softmax(s, m_i, l_i, rows, n0, len_q, len_k, lo_off, hi_off, qk_scale, BLOCK_N,
                                          HAS_LO, HAS_HI, MASKED, FMA_SOFTMAX)
        acc = tlx.async_dot_wait(0, acc)
        prev_buf, _ = _slot_phase(kv_count - 1, NUM_BUFFERS_KV)
        tlx.barrier_arrive(v_empties[prev_buf], 1)
        acc = acc * alpha[:, None]  # acc (previous block's scale, its PV included) to the new maximum
        p = p_new.to(DTYPE)
        prev_n0 = n0
        kv_count += 1
    return acc, m_i, l_i, p, prev_n0, kv_count


@triton.jit
def _consume_first(m_i, l_i, kv_count, q_tile, k_tiles, k_fulls, k_empties, rows, len_q, len_k, lo_off, hi_off,
                   qk_scale, n0, CID: tl.constexpr, BLOCK_N: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr,
                   HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, FMA_SOFTMAX: tl.constexpr, DTYPE: tl.constexpr):
    """The peeled first block of a pipelined tile: QK^T and a masked softmax (masking a fully visible block is
    harmless), its PV left pending. Returns (m, l, p, kv_count + 1)."""
    buf, phase = _slot_phase(kv_count, NUM_BUFFERS_KV)
    tlx.barrier_wait(k_fulls[buf], phase)
    s = _qk(q_tile, k_tiles[buf], CID)
    s = tlx.async_dot_wait(0, s)
    tlx.barrier_arrive(k_empties[buf], 1)
    p, m_i, l_i, alpha = _softmax(s, m_i, l_i, rows, n0, len_q, len_k, lo_off, hi_off, qk_scale, BLOCK_N, HAS_LO,
                                  HAS_HI, True, FMA_SOFTMAX)
    return m_i, l_i, p.to(DTYPE), kv_count + 1


@triton.jit
def _p_carried(p, DTYPE: tl.constexpr, PACK_P: tl.constexpr):
    """A block's probabilities as the loop carries them to the next iteration's PV: converted to DTYPE, or with PACK_P
    (PEEL's mask-free loops) as they are (fp32; ``_p_operand`` converts them where the PV wgmma takes them)."""
    if PACK_P:
        return p
    else:
        return p.to(DTYPE)


@triton.jit
def _p_operand(p, DTYPE: tl.constexpr, PACK_P: tl.constexpr):
    """The PV wgmma's register operand from ``_p_carried``'s P: with PACK_P one ``cvt.rn.{bf16,f16}x2.f32`` per pair,
    the rounding of ``p.to(DTYPE)`` (the same bits). Why (bench/NOTES.md "fwdsum37", "peeldiag38"): without it LLVM
    folds the two
    conversions of the loop-carried P (first block, loop body) across the loop header's phi into one scalar
    ``cvt.rn.bf16.f32`` per element there, packed by ``mov.b32 {lo, hi}``; ptxas pairs those into F2FP.PACK_AB with
    the halves swapped plus one PRMT per register in consumer 0 (32 per block; consumer 1, the same PTX, gets none).
    Converting at the use in packed pairs (an inline asm result, which no fold moves) leaves ptxas nothing to swap.
    Converting at the loop's end instead kept the PRMT away too but spilled one register per block in consumer 0."""
    if PACK_P:
        if DTYPE == tl.bfloat16:  # d, a, b: a to the upper half, b to the lower; pack=2: elements 2i ($1), 2i + 1 ($2)
            return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [p], dtype=tl.bfloat16,
                                             is_pure=True, pack=2)
        else:
            return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [p], dtype=tl.float16,
                                             is_pure=True, pack=2)
    else:
        return p


@triton.jit
def _p_form(p, DTYPE: tl.constexpr, PACKED: tl.constexpr):
    """PEEL: P, already rounded to DTYPE, in a loop's carried form (``_p_carried``'s): fp32 when PACKED (exact, so
    ``_p_operand`` rounds it back to the same bits), else DTYPE."""
    if PACKED:
        return p.to(tl.float32)
    else:
        return p.to(DTYPE)


@triton.jit
def _one_loop_block(acc, m_i, l_i, p, prev_n0, kv_count, n0, masked, q_tile, k_tiles, v_tiles, k_fulls,
                    k_empties, v_fulls, v_empties, rows, keys, rows_left, len_k, lo_off, hi_off, qk_scale,
                    CID: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr,
                    HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, FMA_SOFTMAX: tl.constexpr, DTYPE: tl.constexpr,
                    PACK_P: tl.constexpr):
    """One block (keys from n0) of ``_consume_tile_one_loop``'s loop after the first: its QK^T, the previous block's
    PV (at prev_n0), its softmax. ``masked``: a runtime test (the one loop) or a constexpr (PEEL's loops: no mask
    code in the mask-free one). PACK_P: P carried in fp32 (PEEL's mask-free loops: ``_p_carried``). Returns (acc,
    m_i, l_i, p, kv_count)."""
    buf, phase = _slot_phase(kv_count, NUM_BUFFERS_KV)
    tlx.barrier_wait(k_fulls[buf], phase)
    # FA3's turn: both matmuls issued back to back (QK^T of this block, PV of the previous one), then the turn
    # passes, so this softmax overlaps the other consumer's two matmuls as well as this PV.
    _wait_turn(CID)
    s = tlx.async_dot(q_tile, tlx.local_trans(k_tiles[buf]))
    # CHECK_END False: only a tile's last block can run past the sequence end (blocks are contiguous, in order),
    # and the fix-up's barrier with the other consumer must not sit inside a turn
    acc = _pv_pending(acc, _p_operand(p, DTYPE, PACK_P), prev_n0, kv_count - 1, v_tiles, v_fulls, len_k, CID,
                      HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV, False)
    _pass_turn(CID)
    s = tlx.async_dot_wait(1, s)  # QK^T done; the PV may still run
    tlx.barrier_arrive(k_empties[buf], 1)
    if not FMA_SOFTMAX:  # scale before masking: -inf times a negative scale would be +inf
        s = s * qk_scale
    if masked:
        s = tl.where(key_interval_mask(rows, keys, rows_left, len_k - n0, lo_off, hi_off, HAS_LO, HAS_HI), s,
                     float("-inf"))
    # the masked form (rows that saw no key keep m = -inf) on every block: its guard is per row, 2 per thread (and
    # PEEL's loops give the one loop's bits)
    p_new, alpha, m_i, l_i = softmax_step(s, m_i, l_i, qk_scale, True, FMA_SOFTMAX)
    acc = tlx.async_dot_wait(0, acc)
    prev_buf, _ = _slot_phase(kv_count - 1, NUM_BUFFERS_KV)
    tlx.barrier_arrive(v_empties[prev_buf], 1)
    acc = acc * alpha[:, None]  # acc (previous block's scale, its PV included) to the new maximum
    p = _p_carried(p_new, DTYPE, PACK_P)
    kv_count += 1
    return acc, m_i, l_i, p, kv_count


@triton.jit
def _one_loop_blocks(acc, m_i, l_i, p, prev_n0, kv_count, j_begin, j_end, MASKED: tl.constexpr, q_tile,
                     k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, rows, keys, rows_left, len_k, lo_off,
                     hi_off, qk_scale, ids, sel_first, CID: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_KV: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr,
                     HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, FMA_SOFTMAX: tl.constexpr, DTYPE: tl.constexpr,
                     PACK_P: tl.constexpr):
    """PEEL: walk tiles j_begin .. j_end - 1 of ``_consume_tile_one_loop``'s block-sparse walk, its loop body
    (``_one_loop_block``) with the mask a constexpr (MASKED: every block masked; else none). Returns (acc, m_i, l_i,
    p, prev_n0, kv_count)."""
    for j in tl.range(j_begin, j_end, num_stages=0):
        n0 = selected_tile_start(ids, sel_first + j, BLOCK_KV, BLOCK_N)
        acc, m_i, l_i, p, kv_count = _one_loop_block(
            acc, m_i, l_i, p, prev_n0, kv_count, n0, MASKED, q_tile, k_tiles, v_tiles, k_fulls, k_empties,
            v_fulls, v_empties, rows, keys, rows_left, len_k, lo_off, hi_off, qk_scale, CID, HEAD_DIM, BLOCK_N,
            NUM_BUFFERS_KV, HAS_LO, HAS_HI, FMA_SOFTMAX, DTYPE, PACK_P)
        prev_n0 = n0
    return acc, m_i, l_i, p, prev_n0, kv_count


@triton.jit
def _consume_tile_one_loop(acc, m_i, l_i, kv_count, q_tile, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties,
                           q_empty, row0, len_q, len_k, lo_off, hi_off, qk_scale, lead_begin, lead_end, bulk_begin,
                           bulk_end, tail_begin, tail_end, CID: tl.constexpr, HEAD_DIM: tl.constexpr,
                           BLOCK_N: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, HAS_LO: tl.constexpr,
                           HAS_HI: tl.constexpr, FMA_SOFTMAX: tl.constexpr, DTYPE: tl.constexpr, ids=None,
                           sel_first=0, sel_count=0, SPARSE: tl.constexpr = False, BLOCK_KV: tl.constexpr = 0,
                           SPARSE_ABLATE: tl.constexpr = 0, sel_lead=0, sel_unmasked=0, PEEL: tl.constexpr = False,
                           STORE_TMA: tl.constexpr = False, q_empties=None, staged_slot=-1,
                           FIRST_UNMASKED: tl.constexpr = False):
    """All key blocks of a tile (at least one), software-pipelined as FA3 (``mma_one_n_block_intrawg_overlap``):
    block j's QK^T is issued, then block j-1's PV, and block j's softmax runs while that PV is in flight. The loop
    has num_stages=0: else Triton's pipeliner (asyncLaunchDots) waits for each wgmma right after issuing it.

    One loop over the masked lead, the mask-free bulk and the masked tail, the mask under a runtime branch (the
    backward's lesson, bench/NOTES.md "TLX backward: register budget": three instances of the loop body each keep
    their own hoisted wgmma descriptors and addresses live across all three loops, which ptxas spilled). Mask
    positions are block-relative (rows from row0, keys from n0, lengths shifted to match): absolute positions let LLVM
    widen the loop counter to 64 bits and hoist a 64-bit bound per element; the mask is a key interval per row
    (``common.key_interval_mask``): ``visible``'s key - row per element was hoisted as 64 loop-invariant registers
    per thread, which ptxas spilled. Returns (acc, m, l, kv_count) with the last block's PV still in flight: the
    caller waits for it (``async_dot_wait(0, acc)``) and frees its value buffer (kv_count - 1).

    SPARSE: the blocks are selected tiles sel_first .. sel_first + sel_count - 1 of the selection at ``ids``
    (``selected_tile_start``; ascending, all starting inside the sequence, so again only the last one may run past
    its end); a tile is masked when it is the first or lies outside the mask-free bulk [bulk_begin, bulk_end). Each
    tile's id is read at the top of its iteration, before the wait for its key block (reading it one iteration
    ahead spilled more: bench/NOTES.md "TLX block-sparse forward v1").

    SPARSE_ABLATE (``configs.SPARSE_FORWARD_ABLATE``, timing only: wrong results; bench/NOTES.md "helper sparse38"):
    1 never takes the loop's masked branch (a runtime test that is always false, so the loop compiles as the
    default's: what the masked blocks after the first, the causal diagonal, cost over unmasked ones).

    PEEL (SPARSE, ``configs.SPARSE_FORWARD_PEEL``; bench/NOTES.md "helper peeldiag38"): the walk's blocks after the
    first in loops of their own, split where ``_selected_item`` found the mask-free bulk (walk tiles sel_lead ..
    sel_unmasked - 1): the mask a constexpr per loop (``_one_loop_blocks``), so the bulk's loop carries no mask code
    (the one loop's runtime ``if masked`` is a real branch, but its test, branch and consumer 0's PRMT sit on every
    block's path, and its masked branch spilled: 28 STL/LDL per block in consumer 0).
    Without a left window there is no masked lead: the bulk's loop, then the masked tail's (causal diagonal, window
    end, the sequence's last partial tile). With one: two rounds of (masked loop, bulk loop), the lead and the bulk,
    then the tail and nothing, so the masked body is compiled once (the backward's PEEL, helper peel37). The
    mask-free loops carry P packed (``_p_operand``'s conversion at the PV), the masked ones in DTYPE; P crosses
    between loops in DTYPE. sm_90 D128 bf16 causal: mask-free loop paths 468 / 468 per consumer warp and block
    (one loop: 507 / 481), masked 691 / 607, no STL/LDL in any loop (one loop: 28 in consumer 0's masked branch),
    spills 156 -> 116 B. The same blocks in the same order with the same arithmetic and roundings: the same bits as
    the one loop.

    FIRST_UNMASKED (SPARSE, ``configs.SPARSE_FORWARD_FIRST_UNMASKED``; helper itemcost, bench/NOTES.md stop 56): the
    walk's first block takes the loop's form (scale, the key interval mask only when the tile lies outside the
    mask-free bulk, ``softmax_step``'s masked form) instead of ``_softmax``'s always-masked path: items whose first
    tile is mask-free skip the mask (sm_90 D128 bf16 causal, helper itemcost: the prologue's straight path 889 -> 464
    instructions in consumer 0, FSEL 194 -> 2, its spills gone; the block loop unchanged). The same bits: masking a
    fully visible block is the identity."""
    tl.static_assert(not PEEL or (SPARSE and SPARSE_ABLATE == 0), "PEEL: the block-sparse walk, not the ablation")
    tl.static_assert(not FIRST_UNMASKED or (SPARSE and SPARSE_ABLATE == 0),
                     "FIRST_UNMASKED: the block-sparse walk, not the ablation")
    if SPARSE:
        n_all = sel_count
        n0 = selected_tile_start(ids, sel_first, BLOCK_KV, BLOCK_N)
    else:
        n_lead = _n_blocks(lead_begin, lead_end, BLOCK_N)
        n_unmasked = n_lead + _n_blocks(bulk_begin, bulk_end, BLOCK_N)
        n_all = n_unmasked + _n_blocks(tail_begin, tail_end, BLOCK_N)
        n0 = stage_block_start(0, n_lead, n_unmasked, lead_begin, bulk_begin, tail_begin, BLOCK_N)
    rows = tl.arange(0, q_tile.shape[0])
    keys = tl.arange(0, BLOCK_N)
    rows_left = len_q - row0
    # the first block: QK^T and a masked softmax (masking a fully visible block is harmless); its PV left pending
    buf, phase = _slot_phase(kv_count, NUM_BUFFERS_KV)
    tlx.barrier_wait(k_fulls[buf], phase)
    s = _qk(q_tile, k_tiles[buf], CID)
    if STORE_TMA:  # the previous item's out has had its TMA store's read since; its Q slot goes back to the producer
        _release_staged(q_empties, staged_slot)
    s = tlx.async_dot_wait(0, s)
    tlx.barrier_arrive(k_empties[buf], 1)
    if FIRST_UNMASKED:  # the loop's form: the mask only where the tile needs it (a mask-free first tile: none)
        if not FMA_SOFTMAX:  # scale before masking: -inf times a negative scale would be +inf
            s = s * qk_scale
        if (n0 < bulk_begin) | (n0 + BLOCK_N > bulk_end):
            s = tl.where(key_interval_mask(rows, keys, rows_left, len_k - n0, lo_off, hi_off, HAS_LO, HAS_HI), s,
                         float("-inf"))
        p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, qk_scale, True, FMA_SOFTMAX)
    else:
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, rows, 0, rows_left, len_k - n0, lo_off, hi_off, qk_scale,
                                      BLOCK_N, HAS_LO, HAS_HI, True, FMA_SOFTMAX)
    p = p.to(DTYPE)
    prev_n0 = n0
    kv_count += 1
    if PEEL:
        lead1 = tl.maximum(sel_lead, 1)  # walk tile 0 is done
        unmasked1 = tl.maximum(sel_unmasked, 1)
        # P between the loops in DTYPE (rounded as the PV would round it: the same bits either way); the mask-free
        # loops carry it packed (``_p_carried``'s PACK_P form: in fp32 form across their header phi, LLVM's fold of
        # the conversion puts 32 PRMT per block into both consumers' loops), the masked loops unpacked (packed,
        # consumer 0's masked loop spilled 26 STL/LDL a block; unpacked, none: sm_90 D128 bf16 causal)
        if HAS_LO:
            for rnd in tl.range(0, 2):  # round 0: the masked lead, the bulk; round 1: the masked tail, nothing
                acc, m_i, l_i, p, prev_n0, kv_count = _one_loop_blocks(
                    acc, m_i, l_i, p, prev_n0, kv_count,
                    tl.where(rnd == 0, 1, unmasked1), tl.where(rnd == 0, lead1, n_all), True, q_tile, k_tiles,
                    v_tiles, k_fulls, k_empties, v_fulls, v_empties, rows, keys, rows_left, len_k, lo_off, hi_off,
                    qk_scale, ids, sel_first, CID, HEAD_DIM, BLOCK_N, BLOCK_KV, NUM_BUFFERS_KV, HAS_LO, HAS_HI,
                    FMA_SOFTMAX, DTYPE, False)
                acc, m_i, l_i, p, prev_n0, kv_count = _one_loop_blocks(
                    acc, m_i, l_i, _p_form(p, DTYPE, True), prev_n0, kv_count, lead1,
                    tl.where(rnd == 0, unmasked1, lead1), False, q_tile, k_tiles, v_tiles, k_fulls, k_empties,
                    v_fulls, v_empties, rows, keys, rows_left, len_k, lo_off, hi_off, qk_scale, ids, sel_first, CID,
                    HEAD_DIM, BLOCK_N, BLOCK_KV, NUM_BUFFERS_KV, HAS_LO, HAS_HI, FMA_SOFTMAX, DTYPE, True)
                p = p.to(DTYPE)
        else:  # no masked lead (bulk_begin is the walk's first key): the bulk, then the masked tail
            acc, m_i, l_i, p, prev_n0, kv_count = _one_loop_blocks(
                acc, m_i, l_i, _p_form(p, DTYPE, True), prev_n0, kv_count, 1, unmasked1, False, q_tile,
                k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, rows, keys, rows_left, len_k, lo_off, hi_off,
                qk_scale, ids, sel_first, CID, HEAD_DIM, BLOCK_N, BLOCK_KV, NUM_BUFFERS_KV, HAS_LO, HAS_HI,
                FMA_SOFTMAX, DTYPE, True)
            acc, m_i, l_i, p, prev_n0, kv_count = _one_loop_blocks(
                acc, m_i, l_i, p.to(DTYPE), prev_n0, kv_count, unmasked1, n_all,
                True, q_tile, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, rows, keys, rows_left, len_k,
                lo_off, hi_off, qk_scale, ids, sel_first, CID, HEAD_DIM, BLOCK_N, BLOCK_KV, NUM_BUFFERS_KV, HAS_LO,
                HAS_HI, FMA_SOFTMAX, DTYPE, False)
        p = p.to(DTYPE)  # (the one loop's carried form, for the last PV)
    else:
        for j in tl.range(1, n_all, num_stages=0):
            if SPARSE:
                n0 = selected_tile_start(ids, sel_first + j, BLOCK_KV, BLOCK_N)
                if SPARSE_ABLATE == 1:  # never (selected tiles start at key 0 or later), unknown to the compiler
                    masked = n0 < -BLOCK_N
                else:
                    masked = (n0 < bulk_begin) | (n0 + BLOCK_N > bulk_end)
            else:
                n0 = stage_block_start(j, n_lead, n_unmasked, lead_begin, bulk_begin, tail_begin, BLOCK_N)
                masked = (j < n_lead) | (j >= n_unmasked)
            acc, m_i, l_i, p, kv_count = _one_loop_block(
                acc, m_i, l_i, p, prev_n0, kv_count, n0, masked, q_tile, k_tiles, v_tiles, k_fulls,
                k_empties, v_fulls, v_empties, rows, keys, rows_left, len_k, lo_off, hi_off, qk_scale, CID, HEAD_DIM,
                BLOCK_N, NUM_BUFFERS_KV, HAS_LO, HAS_HI, FMA_SOFTMAX, DTYPE, False)
            prev_n0 = n0
    if not STORE_TMA:  # (STORE_TMA: the caller's epilogue stages out in the slot, then releases it)
        tlx.barrier_arrive(q_empty, 1)  # every QK^T of this tile has completed
    acc = _pv_pending(acc, p, prev_n0, kv_count - 1, v_tiles, v_fulls, len_k, CID, HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV,
                      True)
    return acc, m_i, l_i, kv_count


@triton.jit
def _store_tile(acc, m_i, l_i, rows, len_q, out_row0, head, Out, Lse, stride_ot, stride_oh, total_out,
                HEAD_DIM: tl.constexpr):
    """out = acc / l and lse of one consumer's rows (absolute positions ``rows``), stored where rows < len_q. Rows
    that saw no key: l = 0, acc = 0 -> out 0 and lse -inf (never 0/0)."""
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
    rows_ok = rows < len_q
    out_rows = out_row0 + rows
    d = tl.arange(0, HEAD_DIM)
    tl.store(Out + out_rows[:, None] * stride_ot + head * stride_oh + d[None, :], out.to(Out.dtype.element_ty),
             mask=rows_ok[:, None])
    tl.store(Lse + head.to(tl.int64) * total_out + out_rows, lse, mask=rows_ok)


@triton.jit
def _store_tile_staged(acc, m_i, l_i, row0, len_q, out_row0, head, Out, Lse, stride_ot, stride_oh, total_out, q_tiles,
                       q_empties, qb, desc_o, HALF_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """STORE_TMA: ``_store_tile`` of one consumer's half-tile (rows row0 .. row0 + HALF_M - 1 of its sequence) through
    its Q slot ``qb`` (every QK^T that read it has completed), called inside the item's branch, so acc, m and l never
    cross the item loop's join (where the default's epilogue converts their layout through shared memory: 4 rounds of
    fp32 acc and 3 of m/l, 14 warpgroup barriers, sm_90 D128). out (the same division, rounded to the Q dtype) goes
    into the slot by stmatrix; a half-tile inside the sequence leaves by one TMA store, whose read of the slot is
    waited for only when the slot is released (``_release_staged``, under the next item's first QK^T); a partial one
    (rows past the sequence must not be written, which a TMA box cannot mask) is read back for masked pointer stores
    and its slot released at once. lse by pointer stores. Returns the slot still to release (-1: none)."""
    o_tile = q_tiles[qb]
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
    tlx.local_store(o_tile, out.to(tlx.dtype_of(desc_o)))
    tlx.fence_async_shared()  # the TMA store (async proxy) must see these generic-proxy writes
    rows = row0 + tl.arange(0, HALF_M)
    rows_ok = rows < len_q
    whole = row0 + HALF_M <= len_q
    if whole:
        tlx.async_descriptor_store(desc_o, o_tile, [(out_row0 + row0).to(tl.int32), head * HEAD_DIM])
    else:  # read back in the pointer stores' layout (one pass through the slot: no scratch round trips)
        d = tl.arange(0, HEAD_DIM)
        tl.store(Out + (out_row0 + rows)[:, None] * stride_ot + head * stride_oh + d[None, :], tlx.local_load(o_tile),
                 mask=rows_ok[:, None])
    tl.store(Lse + head.to(tl.int64) * total_out + out_row0 + rows, lse, mask=rows_ok)
    pending = tl.where(whole, qb, -1)
    if not whole:
        tlx.barrier_arrive(q_empties[qb], 1)
    return pending


@triton.jit
def _release_staged(q_empties, slot):
    """STORE_TMA: release Q slot ``slot`` (>= 0) once this thread's TMA stores have read it (``_store_tile_staged``'s
    pending slot; the producer loads the item after next into it)."""
    if slot >= 0:
        tlx.async_descriptor_store_wait(0)
        tlx.barrier_arrive(q_empties[slot], 1)


@triton.jit
def _consume_item_v3(item, kv_count, q_count, q_tiles, q_fulls, q_empties, k_tiles, k_fulls, k_empties, v_tiles,
                     v_fulls, v_empties, Out, Lse, stride_ot, stride_oh, total_out, qk_scale, window_left, right,
                     cid: tl.constexpr, HALF_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                     NUM_BUFFERS_KV: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr, HAS_LEFT: tl.constexpr,
                     HAS_RIGHT: tl.constexpr, FMA_SOFTMAX: tl.constexpr, PIPELINE: tl.constexpr,
                     dtype: tl.constexpr):
    """One work item (``_work_tile``'s tuple) on the v3 consumers (v2: PIPELINE), this consumer's half: its key
    blocks, then out/lse stored. Returns (kv_count, q_count): the Q slot is taken only by an item with blocks."""
    (real, head, m0, out_row0, len_q, kv_row0, len_k, lead_begin, lead_end, bulk_begin, bulk_end,
     tail_begin, tail_end, seq) = item
    if real:
        n_blocks = _n_blocks(lead_begin, lead_end, BLOCK_N) \
            + _n_blocks(bulk_begin, bulk_end, BLOCK_N) + _n_blocks(tail_begin, tail_end, BLOCK_N)
        rows = m0 + cid * HALF_M + tl.arange(0, HALF_M)
        m_i = tl.full([HALF_M], float("-inf"), tl.float32)
        l_i = tl.zeros([HALF_M], tl.float32)
        acc = tl.zeros([HALF_M, HEAD_DIM], tl.float32)
        if n_blocks > 0:
            q_slot, q_phase = _slot_phase(q_count, NUM_BUFFERS_Q)
            qb = q_slot * NUM_CONSUMERS + cid
            tlx.barrier_wait(q_fulls[qb], q_phase)
            q_tile = q_tiles[qb]
            if PIPELINE:
                n_lead = _n_blocks(lead_begin, lead_end, BLOCK_N)
                first_lead = n_lead > 0
                first_bulk = (n_lead == 0) & (_n_blocks(bulk_begin, bulk_end, BLOCK_N) > 0)
                first_n0 = tl.where(first_lead, lead_begin,
                                    tl.where(first_bulk, bulk_begin, tail_begin))
                m_i, l_i, p, kv_count = _consume_first(
                    m_i, l_i, kv_count, q_tile, k_tiles, k_fulls, k_empties, rows, len_q, len_k,
                    -window_left, right, qk_scale, first_n0, cid, BLOCK_N, NUM_BUFFERS_KV, HAS_LEFT,
                    HAS_RIGHT, FMA_SOFTMAX, dtype)
                prev_n0 = first_n0
                # the remaining blocks of each stage (the first one is done)
                lead_from = lead_begin + tl.where(first_lead, BLOCK_N, 0)
                bulk_from = bulk_begin + tl.where(first_bulk, BLOCK_N, 0)
                tail_from = tail_begin + tl.where(first_lead | first_bulk, 0, BLOCK_N)
                acc, m_i, l_i, p, prev_n0, kv_count = _consume_blocks_pipelined(
                    acc, m_i, l_i, p, prev_n0, kv_count, q_tile, k_tiles, v_tiles, k_fulls, k_empties,
                    v_fulls, v_empties, rows, len_q, len_k, -window_left, right, qk_scale, lead_from,
                    lead_end, cid, HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV, HAS_LEFT, HAS_RIGHT, True,
                    FMA_SOFTMAX, dtype)
                acc, m_i, l_i, p, prev_n0, kv_count = _consume_blocks_pipelined(
                    acc, m_i, l_i, p, prev_n0, kv_count, q_tile, k_tiles, v_tiles, k_fulls, k_empties,
                    v_fulls, v_empties, rows, len_q, len_k, -window_left, right, qk_scale, bulk_from,
                    bulk_end, cid, HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV, HAS_LEFT, HAS_RIGHT, False,
                    FMA_SOFTMAX, dtype)
                acc, m_i, l_i, p, prev_n0, kv_count = _consume_blocks_pipelined(
                    acc, m_i, l_i, p, prev_n0, kv_count, q_tile, k_tiles, v_tiles, k_fulls, k_empties,
                    v_fulls, v_empties, rows, len_q, len_k, -window_left, right, qk_scale, tail_from,
                    tail_end, cid, HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV, HAS_LEFT, HAS_RIGHT, True,
                    FMA_SOFTMAX, dtype)
                tlx.barrier_arrive(q_empties[qb], 1)  # every QK^T of this tile has completed
                acc = _pv_pending(acc, p, prev_n0, kv_count - 1, v_tiles, v_fulls, len_k, cid, HEAD_DIM,
                                  BLOCK_N, NUM_BUFFERS_KV, True)
                acc = tlx.async_dot_wait(0, acc)
                last_buf, _ = _slot_phase(kv_count - 1, NUM_BUFFERS_KV)
                tlx.barrier_arrive(v_empties[last_buf], 1)
            else:
                acc, m_i, l_i, kv_count = _consume_blocks(
                    acc, m_i, l_i, kv_count, q_tile, k_tiles, v_tiles, k_fulls, k_empties, v_fulls,
                    v_empties, rows, len_q, len_k, -window_left, right, qk_scale, lead_begin,
                    lead_end, cid, HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV, HAS_LEFT, HAS_RIGHT, True,
                    FMA_SOFTMAX, dtype)
                acc, m_i, l_i, kv_count = _consume_blocks(
                    acc, m_i, l_i, kv_count, q_tile, k_tiles, v_tiles, k_fulls, k_empties, v_fulls,
                    v_empties, rows, len_q, len_k, -window_left, right, qk_scale, bulk_begin,
                    bulk_end, cid, HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV, HAS_LEFT, HAS_RIGHT, False,
                    FMA_SOFTMAX, dtype)
                acc, m_i, l_i, kv_count = _consume_blocks(
                    acc, m_i, l_i, kv_count, q_tile, k_tiles, v_tiles, k_fulls, k_empties, v_fulls,
                    v_empties, rows, len_q, len_k, -window_left, right, qk_scale, tail_begin,
                    tail_end, cid, HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV, HAS_LEFT, HAS_RIGHT, True,
                    FMA_SOFTMAX, dtype)
                tlx.barrier_arrive(q_empties[qb], 1)  # every QK^T of this tile has completed
            q_count += 1
        _store_tile(acc, m_i, l_i, rows, len_q, out_row0, head, Out, Lse, stride_ot, stride_oh,
                    total_out, HEAD_DIM)
    return kv_count, q_count


@triton.jit(do_not_specialize=["num_heads", "total_out", "group", "window_left", "right", "n_slots", "search_steps",
                               "num_seqs", "rows_s", "rows_o", "n_q_blocks", "head_group"])
def attn_fwd_tlx_kernel(desc_q, desc_k, desc_v, Out, Lse, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, TILE_COUNT,
                        WORK_COUNTER, num_heads, total_out, n_slots, search_steps, num_seqs, rows_s, rows_o,
                        stride_ot, stride_oh, group, qk_scale, window_left, right, head_group,
                        BLOCK_INDEX, BLOCK_COUNT, n_q_blocks, stride_ib, stride_ih, stride_in, stride_cb, stride_ch,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        NUM_BUFFERS_KV: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr, HAS_LEFT: tl.constexpr,
                        HAS_RIGHT: tl.constexpr, KV_MAJOR: tl.constexpr,
                        BROADCAST_Q: tl.constexpr, FMA_SOFTMAX: tl.constexpr, PIPELINE: tl.constexpr,
                        ATOMIC_WORK: tl.constexpr, TILES_FROM_OFFSETS: tl.constexpr, ONE_LOOP: tl.constexpr = False,
                        SPARSE: tl.constexpr = False, BLOCK_Q: tl.constexpr = 0, BLOCK_KV: tl.constexpr = 0,
                        UNIFORM_WALK: tl.constexpr = False, ZIGZAG: tl.constexpr = False,
                        WALK_AHEAD: tl.constexpr = False, SPARSE_ABLATE: tl.constexpr = 0,
                        SPARSE_PEEL: tl.constexpr = False, desc_o=None, STORE_TMA: tl.constexpr = False,
                        FIRST_UNMASKED: tl.constexpr = False):
    """Work items (query tile of BLOCK_M rows, q head); see the module docstring. desc_q: [T_q (broadcast: L_q),
    Hq*D] with block [BLOCK_M/2, D]; desc_k/desc_v: [T_kv, Hkv*D] with block [BLOCK_N, D].

    SPARSE (block-sparse attention, ``block_sparse_forward``): each item walks only the tiles of the KV blocks its
    Q block selected (BLOCK_INDEX [B, Hkv, n_q_blocks, W] ids of BLOCK_KV keys, ascending; BLOCK_COUNT [B, Hkv,
    n_q_blocks]; Q blocks of BLOCK_Q rows), with the v4 consumers; else the selection arguments are None/0.
    UNIFORM_WALK (with SPARSE): the walk's bounds in uniform registers (``_selected_item``,
    ``configs.SPARSE_FORWARD_UNIFORM_WALK``). WALK_AHEAD (with SPARSE, ``configs.SPARSE_FORWARD_WALK_AHEAD``): the
    producer reads item i + 1's work entry and walk after issuing item i's first NUM_BUFFERS_KV tiles instead of
    after its last, and every walk reads its row's first ids beside the count (``_selected_item``'s ROW_WIDTH): the
    same tiles in the same order, only when the dependent reads happen. ZIGZAG (``configs.FORWARD_ZIGZAG``): the
    items in ``common.zigzag_item``'s order over kv heads in groups of head_group, taken by the snake
    (``common.snake_work``), instead of static striding over ``work_item``'s. SPARSE_PEEL (with SPARSE,
    ``configs.SPARSE_FORWARD_PEEL``): the consumers' walk split at the mask-free bulk, its masked and mask-free blocks
    in loops of their own (``_consume_tile_one_loop``'s PEEL; the producer's walk unchanged). FIRST_UNMASKED (with
    SPARSE, ``configs.SPARSE_FORWARD_FIRST_UNMASKED``): each item's first block masked only where its tile needs it
    (``_consume_tile_one_loop``'s FIRST_UNMASKED)."""
    tl.static_assert(not ATOMIC_WORK or not (ONE_LOOP or ZIGZAG or WALK_AHEAD),
                     "ATOMIC_WORK (configs.FORWARD_DYNAMIC): the v3 consumers, tile list order")
    tl.static_assert(not SPARSE or (ONE_LOOP and BLOCK_Q % BLOCK_M == 0 and BLOCK_KV % BLOCK_N == 0),
                     "the block-sparse walk runs on the v4 consumers, with whole tiles per selected block")
    tl.static_assert(not UNIFORM_WALK or SPARSE, "UNIFORM_WALK: block-sparse only")
    tl.static_assert(not WALK_AHEAD or SPARSE, "WALK_AHEAD: block-sparse only")
    tl.static_assert(SPARSE_ABLATE == 0 or SPARSE, "SPARSE_ABLATE: block-sparse only")
    tl.static_assert(not SPARSE_PEEL or (SPARSE and SPARSE_ABLATE == 0), "SPARSE_PEEL: block-sparse, no ablation")
    tl.static_assert(not FIRST_UNMASKED or (SPARSE and SPARSE_ABLATE == 0),
                     "FIRST_UNMASKED: block-sparse, no ablation")
    tl.static_assert(not STORE_TMA or ONE_LOOP, "STORE_TMA: the v4 consumers")
    HALF_M: tl.constexpr = BLOCK_M // NUM_CONSUMERS
    # the consumers' walks read the row's first ids beside the count with WALK_AHEAD, but not under a left window:
    # there ptxas spilled 48 B more per thread and 8 more STL/LDL in consumer 0's masked branch (sm_90 D128 fp16)
    CONSUMER_ROW_WIDTH: tl.constexpr = WALK_AHEAD and not HAS_LEFT
    dtype: tl.constexpr = tlx.dtype_of(desc_q)
    n_tiles = _tile_count(TILE_COUNT, n_slots, TILES_FROM_OFFSETS)  # the real count stays on the device
    n_work = n_tiles * num_heads
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    my_items = snake_items(n_work, pid, programs, ZIGZAG)

    # Query half-tiles: buffer (item % NUM_BUFFERS_Q) * 2 + consumer; two buffers let the producer load the next
    # item's Q while the consumers finish this one (no TMA latency between work items).
    q_tiles = tlx.local_alloc((HALF_M, HEAD_DIM), dtype, NUM_CONSUMERS * NUM_BUFFERS_Q)
    k_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, NUM_BUFFERS_KV)
    v_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, NUM_BUFFERS_KV)
    q_fulls = tlx.alloc_barriers(num_barriers=NUM_CONSUMERS * NUM_BUFFERS_Q, arrive_count=1)
    q_empties = tlx.alloc_barriers(num_barriers=NUM_CONSUMERS * NUM_BUFFERS_Q, arrive_count=1)
    k_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1)
    k_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=NUM_CONSUMERS)
    v_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1)
    v_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=NUM_CONSUMERS)
    if ATOMIC_WORK:  # the work index of each Q slot's item, from the producer (which took it) to the consumers
        work_ids = tlx.local_alloc((1,), tl.int32, NUM_BUFFERS_Q)
    else:
        work_ids = None

    with tlx.async_tasks():
        with tlx.async_task("default"):  # producer: TMA loads only
            kv_count = 0
            q_count = 0
            if WALK_AHEAD:  # SPARSE: item i + 1's walk read after item i's first tiles, while the ring is full
                if my_items > 0:  # no list entry read without an item (as the consumers)
                    item = _work_tile(pid, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles, num_heads, group, num_seqs,
                                      search_steps, rows_s, rows_o, window_left, right, BLOCK_M, BLOCK_N, HAS_LEFT,
                                      HAS_RIGHT, TILES_FROM_OFFSETS, KV_MAJOR, head_group, ZIGZAG)  # snake_work's i = 0
                    sel = _selected_item(item, BLOCK_INDEX, BLOCK_COUNT, group, n_q_blocks, stride_ib, stride_ih,
                                         stride_in, stride_cb, stride_ch, BLOCK_Q, BLOCK_KV, BLOCK_N, UNIFORM_WALK,
                                         WALK_AHEAD)
                    for i in range(0, my_items):
                        (real, head, m0, out_row0, len_q, kv_row0, len_k, lead_begin, lead_end, bulk_begin,
                         bulk_end, tail_begin, tail_end, seq) = item
                        sel_first, n_blocks = sel
                        kv_col = (head // group) * HEAD_DIM
                        # the tiles loaded before the next walk: as many as the ring holds (then the producer would
                        # wait for a free slot anyway); none for an item that loads nothing
                        lead = tl.where(real & (n_blocks > 0), tl.minimum(n_blocks, NUM_BUFFERS_KV), 0)
                        if lead > 0:
                            q_count = _produce_q(desc_q, q_tiles, q_fulls, q_empties, q_count, m0, out_row0, head,
                                                 HALF_M, HEAD_DIM, tlx.size_of(dtype), NUM_BUFFERS_Q, BROADCAST_Q)
                            kv_count = _produce_selected(desc_k, desc_v, k_tiles, v_tiles, k_fulls, k_empties,
                                                         v_fulls, v_empties, kv_count, kv_row0, kv_col, BLOCK_INDEX,
                                                         sel_first, lead, BLOCK_N, BLOCK_KV, HEAD_DIM, NUM_BUFFERS_KV)
                        # the last one re-reads its own
                        item = _work_tile(snake_work(pid, tl.minimum(i + 1, my_items - 1), programs, ZIGZAG), Q_OFF,
                                          KV_OFF, TILE_SEQ, TILE_START, n_tiles, num_heads, group, num_seqs,
                                          search_steps, rows_s, rows_o, window_left, right, BLOCK_M, BLOCK_N,
                                          HAS_LEFT, HAS_RIGHT, TILES_FROM_OFFSETS, KV_MAJOR, head_group, ZIGZAG)
                        sel = _selected_item(item, BLOCK_INDEX, BLOCK_COUNT, group, n_q_blocks, stride_ib, stride_ih,
                                             stride_in, stride_cb, stride_ch, BLOCK_Q, BLOCK_KV, BLOCK_N, UNIFORM_WALK,
                                             WALK_AHEAD)
                        if lead > 0:
                            kv_count = _produce_selected(desc_k, desc_v, k_tiles, v_tiles, k_fulls, k_empties,
                                                         v_fulls, v_empties, kv_count, kv_row0, kv_col, BLOCK_INDEX,
                                                         sel_first + lead, n_blocks - lead, BLOCK_N, BLOCK_KV,
                                                         HEAD_DIM, NUM_BUFFERS_KV)
            elif ATOMIC_WORK:  # v3 consumers: each item taken from the counter, longest first
                work = tl.atomic_add(WORK_COUNTER, 1, sem="relaxed")
                while work < n_work:
                    (real, head, m0, out_row0, len_q, kv_row0, len_k, lead_begin, lead_end, bulk_begin, bulk_end,
                     tail_begin, tail_end, seq) = _work_tile(
                        work, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles, num_heads, group, num_seqs, search_steps,
                        rows_s, rows_o, window_left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, TILES_FROM_OFFSETS,
                        KV_MAJOR)
                    n_blocks = _n_blocks(lead_begin, lead_end, BLOCK_N) + _n_blocks(bulk_begin, bulk_end, BLOCK_N) \
                        + _n_blocks(tail_begin, tail_end, BLOCK_N)
                    if real & (n_blocks > 0):
                        q_count = _produce_q(desc_q, q_tiles, q_fulls, q_empties, q_count, m0, out_row0, head, HALF_M,
                                             HEAD_DIM, tlx.size_of(dtype), NUM_BUFFERS_Q, BROADCAST_Q, work_ids, work,
                                             True)
                        kv_col = (head // group) * HEAD_DIM
                        kv_count = _produce_blocks(desc_k, desc_v, k_tiles, v_tiles, k_fulls, k_empties, v_fulls,
                                                   v_empties, kv_count, kv_row0, kv_col, lead_begin, lead_end, BLOCK_N,
                                                   HEAD_DIM, NUM_BUFFERS_KV)
                        kv_count = _produce_blocks(desc_k, desc_v, k_tiles, v_tiles, k_fulls, k_empties, v_fulls,
                                                   v_empties, kv_count, kv_row0, kv_col, bulk_begin, bulk_end, BLOCK_N,
                                                   HEAD_DIM, NUM_BUFFERS_KV)
                        kv_count = _produce_blocks(desc_k, desc_v, k_tiles, v_tiles, k_fulls, k_empties, v_fulls,
                                                   v_empties, kv_count, kv_row0, kv_col, tail_begin, tail_end, BLOCK_N,
                                                   HEAD_DIM, NUM_BUFFERS_KV)
                    else:  # the consumers still store it (zeros, lse -inf) and free the slot
                        q_count = _hand_work(work_ids, q_fulls, q_empties, q_count, work, NUM_BUFFERS_Q)
                    # the next item only once this one's loads are issued (the producer then runs NUM_BUFFERS_KV
                    # blocks ahead of the consumers): greedy longest-first, committing no earlier than that
                    work = tl.atomic_add(WORK_COUNTER, 1, sem="relaxed")
                _hand_work(work_ids, q_fulls, q_empties, q_count, work, NUM_BUFFERS_Q)  # the end mark (>= n_work)
            else:
                for i in range(0, my_items):
                    item = _work_tile(snake_work(pid, i, programs, ZIGZAG), Q_OFF, KV_OFF, TILE_SEQ, TILE_START,
                                      n_tiles, num_heads, group, num_seqs, search_steps, rows_s, rows_o, window_left,
                                      right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, TILES_FROM_OFFSETS, KV_MAJOR,
                                      head_group, ZIGZAG)
                    (real, head, m0, out_row0, len_q, kv_row0, len_k, lead_begin, lead_end, bulk_begin, bulk_end,
                     tail_begin, tail_end, seq) = item
                    if SPARSE:
                        sel_first, n_blocks = _selected_item(item, BLOCK_INDEX, BLOCK_COUNT, group, n_q_blocks,
                                                             stride_ib, stride_ih, stride_in, stride_cb, stride_ch,
                                                             BLOCK_Q, BLOCK_KV, BLOCK_N, UNIFORM_WALK)
                    else:
                        n_blocks = _n_blocks(lead_begin, lead_end, BLOCK_N) + _n_blocks(bulk_begin, bulk_end, BLOCK_N) \
                            + _n_blocks(tail_begin, tail_end, BLOCK_N)
                    if real & (n_blocks > 0):
                        q_count = _produce_q(desc_q, q_tiles, q_fulls, q_empties, q_count, m0, out_row0, head, HALF_M,
                                             HEAD_DIM, tlx.size_of(dtype), NUM_BUFFERS_Q, BROADCAST_Q)
                        kv_col = (head // group) * HEAD_DIM
                        if SPARSE:
                            kv_count = _produce_selected(desc_k, desc_v, k_tiles, v_tiles, k_fulls, k_empties, v_fulls,
                                                         v_empties, kv_count, kv_row0, kv_col, BLOCK_INDEX, sel_first,
                                                         n_blocks,
                                                         BLOCK_N, BLOCK_KV, HEAD_DIM, NUM_BUFFERS_KV)
                        else:
                            kv_count = _produce_blocks(desc_k, desc_v, k_tiles, v_tiles, k_fulls, k_empties, v_fulls,
                                                       v_empties, kv_count, kv_row0, kv_col, lead_begin, lead_end,
                                                       BLOCK_N, HEAD_DIM, NUM_BUFFERS_KV)
                            kv_count = _produce_blocks(desc_k, desc_v, k_tiles, v_tiles, k_fulls, k_empties, v_fulls,
                                                       v_empties, kv_count, kv_row0, kv_col, bulk_begin, bulk_end,
                                                       BLOCK_N, HEAD_DIM, NUM_BUFFERS_KV)
                            kv_count = _produce_blocks(desc_k, desc_v, k_tiles, v_tiles, k_fulls, k_empties, v_fulls,
                                                       v_empties, kv_count, kv_row0, kv_col, tail_begin, tail_end,
                                                       BLOCK_N, HEAD_DIM, NUM_BUFFERS_KV)

        with tlx.async_task(num_warps=4, registers=CONSUMER_REGISTERS, replicate=NUM_CONSUMERS):
            cid: tl.constexpr = tlx.async_task_replica_id()
            if cid == 1:  # bootstrap the ping-pong: consumer 0 issues first
                tlx.named_barrier_arrive(PINGPONG_A, 256)
            kv_count = 0
            q_count = 0
            if ONE_LOOP:  # v4: the next item's work list entry is read while this item's last PV runs
                # no list entry read without an item: entries past the list's count are unwritten (an empty list:
                # bad offsets under the folded offset check)
                if my_items > 0:
                    item = _work_tile(pid, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles, num_heads, group, num_seqs,
                                      search_steps, rows_s, rows_o, window_left, right, BLOCK_M, BLOCK_N,
                                      HAS_LEFT, HAS_RIGHT, TILES_FROM_OFFSETS, KV_MAJOR, head_group,
                                      ZIGZAG)  # snake_work's i = 0
                    if SPARSE:  # the selection's walk of the next item is read with it, while the last PV runs
                        sel = _selected_item(item, BLOCK_INDEX, BLOCK_COUNT, group, n_q_blocks, stride_ib, stride_ih,
                                             stride_in, stride_cb, stride_ch, BLOCK_Q, BLOCK_KV, BLOCK_N, UNIFORM_WALK,
                                             CONSUMER_ROW_WIDTH, SPARSE_PEEL)
                    staged = -1  # STORE_TMA: the Q slot whose out a TMA store may still be reading (-1: none)
                    if STORE_TMA:
                        staged = tl.cast(-1, tl.int32)  # (a tensor: the loop carries it)
                    for i in range(0, my_items):
                        (real, head, m0, out_row0, len_q, kv_row0, len_k, lead_begin, lead_end, bulk_begin, bulk_end,
                         tail_begin, tail_end, seq) = item
                        # the last one re-reads its own
                        next_work = snake_work(pid, tl.minimum(i + 1, my_items - 1), programs, ZIGZAG)
                        sel_lead = 0
                        sel_unmasked = 0
                        if SPARSE_PEEL:
                            sel_first, n_blocks, sel_lead, sel_unmasked = sel
                        elif SPARSE:
                            sel_first, n_blocks = sel
                        else:
                            sel_first = 0
                            n_blocks = _n_blocks(lead_begin, lead_end, BLOCK_N) \
                                + _n_blocks(bulk_begin, bulk_end, BLOCK_N) + _n_blocks(tail_begin, tail_end, BLOCK_N)
                        m_i = tl.full([HALF_M], float("-inf"), tl.float32)
                        l_i = tl.zeros([HALF_M], tl.float32)
                        acc = tl.zeros([HALF_M, HEAD_DIM], tl.float32)
                        if real & (n_blocks > 0):
                            q_slot, q_phase = _slot_phase(q_count, NUM_BUFFERS_Q)
                            qb = q_slot * NUM_CONSUMERS + cid
                            tlx.barrier_wait(q_fulls[qb], q_phase)
                            acc, m_i, l_i, kv_count = _consume_tile_one_loop(
                                acc, m_i, l_i, kv_count, q_tiles[qb], k_tiles, v_tiles, k_fulls, k_empties, v_fulls,
                                v_empties, q_empties[qb], m0 + cid * HALF_M, len_q, len_k, -window_left, right,
                                qk_scale, lead_begin, lead_end, bulk_begin, bulk_end, tail_begin, tail_end, cid,
                                HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV, HAS_LEFT, HAS_RIGHT, FMA_SOFTMAX, dtype,
                                BLOCK_INDEX, sel_first, n_blocks, SPARSE, BLOCK_KV, SPARSE_ABLATE, sel_lead,
                                sel_unmasked, SPARSE_PEEL, STORE_TMA, q_empties, staged, FIRST_UNMASKED)
                            item = _work_tile(next_work, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles, num_heads, group,
                                              num_seqs, search_steps, rows_s, rows_o, window_left, right, BLOCK_M,
                                              BLOCK_N, HAS_LEFT, HAS_RIGHT, TILES_FROM_OFFSETS, KV_MAJOR, head_group,
                                              ZIGZAG)
                            if SPARSE:
                                sel = _selected_item(item, BLOCK_INDEX, BLOCK_COUNT, group, n_q_blocks, stride_ib,
                                                     stride_ih, stride_in, stride_cb, stride_ch, BLOCK_Q, BLOCK_KV,
                                                     BLOCK_N, UNIFORM_WALK, CONSUMER_ROW_WIDTH, SPARSE_PEEL)
                            acc = tlx.async_dot_wait(0, acc)  # the last PV
                            last_buf, _ = _slot_phase(kv_count - 1, NUM_BUFFERS_KV)
                            tlx.barrier_arrive(v_empties[last_buf], 1)
                            if STORE_TMA:
                                staged = _store_tile_staged(acc, m_i, l_i, m0 + cid * HALF_M, len_q, out_row0, head,
                                                            Out, Lse, stride_ot, stride_oh, total_out, q_tiles,
                                                            q_empties, qb, desc_o, HALF_M, HEAD_DIM)
                            q_count += 1
                        else:
                            item = _work_tile(next_work, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles, num_heads, group,
                                              num_seqs, search_steps, rows_s, rows_o, window_left, right, BLOCK_M,
                                              BLOCK_N, HAS_LEFT, HAS_RIGHT, TILES_FROM_OFFSETS, KV_MAJOR, head_group,
                                              ZIGZAG)
                            if SPARSE:
                                sel = _selected_item(item, BLOCK_INDEX, BLOCK_COUNT, group, n_q_blocks, stride_ib,
                                                     stride_ih, stride_in, stride_cb, stride_ch, BLOCK_Q, BLOCK_KV,
                                                     BLOCK_N, UNIFORM_WALK, CONSUMER_ROW_WIDTH, SPARSE_PEEL)
                            if STORE_TMA:  # an item without blocks: zeros and lse -inf, inside the branch too
                                _release_staged(q_empties, staged)
                                staged = tl.cast(-1, tl.int32)
                                if real:
                                    _store_tile(acc, m_i, l_i, m0 + cid * HALF_M + tl.arange(0, HALF_M), len_q,
                                                out_row0, head, Out, Lse, stride_ot, stride_oh, total_out, HEAD_DIM)
                        if not STORE_TMA:  # (STORE_TMA stored it inside the branch: acc, m, l cross no join)
                            if real:
                                _store_tile(acc, m_i, l_i, m0 + cid * HALF_M + tl.arange(0, HALF_M), len_q, out_row0,
                                            head, Out, Lse, stride_ot, stride_oh, total_out, HEAD_DIM)
                    if STORE_TMA:  # the last TMA store has read its slot before the program ends
                        _release_staged(q_empties, staged)
            elif ATOMIC_WORK:  # v3, the items the producer took from the counter (handed over with the Q slots)
                work = _read_work(work_ids, q_fulls, q_count, cid, NUM_BUFFERS_Q)
                while work < n_work:
                    took = q_count
                    kv_count, q_count = _consume_item_v3(
                        _work_tile(work, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles, num_heads, group, num_seqs,
                                   search_steps, rows_s, rows_o, window_left, right, BLOCK_M, BLOCK_N, HAS_LEFT,
                                   HAS_RIGHT, TILES_FROM_OFFSETS, KV_MAJOR),
                        kv_count, q_count, q_tiles, q_fulls, q_empties, k_tiles, k_fulls, k_empties, v_tiles, v_fulls,
                        v_empties, Out, Lse, stride_ot, stride_oh, total_out, qk_scale, window_left, right, cid, HALF_M,
                        HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV, NUM_BUFFERS_Q, HAS_LEFT, HAS_RIGHT, FMA_SOFTMAX, PIPELINE,
                        dtype)
                    if q_count == took:  # an item without key blocks: its slot only carried the work index
                        q_slot, _ = _slot_phase(q_count, NUM_BUFFERS_Q)
                        tlx.barrier_arrive(q_empties[q_slot * NUM_CONSUMERS + cid], 1)
                        q_count += 1
                    work = _read_work(work_ids, q_fulls, q_count, cid, NUM_BUFFERS_Q)
            else:  # v3 (and v2: PIPELINE)
                for i in range(0, my_items):
                    kv_count, q_count = _consume_item_v3(
                        _work_tile(snake_work(pid, i, programs, ZIGZAG), Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles,
                                   num_heads, group, num_seqs, search_steps, rows_s, rows_o, window_left, right,
                                   BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, TILES_FROM_OFFSETS, KV_MAJOR, head_group,
                                   ZIGZAG),
                        kv_count, q_count, q_tiles, q_fulls, q_empties, k_tiles, k_fulls, k_empties, v_tiles, v_fulls,
                        v_empties, Out, Lse, stride_ot, stride_oh, total_out, qk_scale, window_left, right, cid, HALF_M,
                        HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV, NUM_BUFFERS_Q, HAS_LEFT, HAS_RIGHT, FMA_SOFTMAX, PIPELINE,
                        dtype)


# ---------------------------------------------------------------------------------------------------------- host side
def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` ([T, H, D]) with packed rows, a 16-byte aligned base and row stride (TMA's rule): itself when it
    already is (slices of a fused projection usually are), else a contiguous copy."""
    t = common.packed_rows(t)
    if t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
        t = t.clone(memory_format=torch.contiguous_format)
    return t


# The kernel's block-sparse arguments when it runs dense attention (SPARSE False).
NO_SELECTION = dict(BLOCK_INDEX=None, BLOCK_COUNT=None, n_q_blocks=0, stride_ib=0, stride_ih=0, stride_in=0,
                    stride_cb=0, stride_ch=0, SPARSE=False, BLOCK_Q=0, BLOCK_KV=0, UNIFORM_WALK=False,
                    WALK_AHEAD=False, SPARSE_ABLATE=0, SPARSE_PEEL=False, FIRST_UNMASKED=False)


def _static_args(num_heads, head_dim, num_heads_kv, cfg, params, bounds, choices, schedule, zigzag=False) -> dict:
    """``attn_fwd_tlx_kernel``'s arguments that follow from a call's signature (a launch plan's static part; the
    block-sparse ones aside): everything but the descriptors, out/lse, the offsets, the schedule's sizes and the
    head group. The output's strides are those of a fresh [T, Hq, D] tensor (``common.alloc_output``). ``zigzag``:
    ``configs.FORWARD_ZIGZAG``'s order."""
    has_left, window_left, has_right, right = bounds
    pipeline, kv_major, one_loop = choices
    return dict(
        num_heads=num_heads, stride_ot=num_heads * head_dim, stride_oh=head_dim, group=num_heads // num_heads_kv,
        qk_scale=params.scale * 1.4426950408889634,  # / ln 2
        window_left=window_left, right=right, HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        NUM_BUFFERS_KV=cfg.num_buffers_kv, NUM_BUFFERS_Q=cfg.num_buffers_q, KV_MAJOR=kv_major, HAS_LEFT=has_left,
        HAS_RIGHT=has_right, BROADCAST_Q=params.broadcast_q, FMA_SOFTMAX=params.scale > 0, PIPELINE=pipeline,
        ONE_LOOP=one_loop, ATOMIC_WORK=schedule["ATOMIC_WORK"], TILES_FROM_OFFSETS=schedule["TILES_FROM_OFFSETS"],
        ZIGZAG=zigzag, STORE_TMA=store_tma(one_loop),
        **({} if store_tma(one_loop) else {"desc_o": None}))  # (else desc_o per call)


def _dynamic_args(q, k, v, out, lse, q_off, kv_off, schedule, cfg, head_group=1, one_loop=False) -> dict:
    """``attn_fwd_tlx_kernel``'s per-call arguments (q, k, v TMA-ready; out/lse allocated): the descriptors over
    q, k, v (each holds its tensor's address and rows), out/lse, the offsets, the schedule's sizes and ZIGZAG's
    head group (``configs.fwd_head_group``: it follows the list's capacity, which the plan key does not hold)."""
    return dict(desc_q=rows_descriptor(q, cfg.block_m // 2), desc_k=rows_descriptor(k, cfg.block_n),
                desc_v=rows_descriptor(v, cfg.block_n), Out=out, Lse=lse, Q_OFF=q_off, KV_OFF=kv_off,
                **schedule_arguments(schedule), total_out=out.shape[0], head_group=head_group,
                **({"desc_o": rows_descriptor(out, cfg.block_m // 2)} if store_tma(one_loop) else {}))


def store_tma(one_loop: bool) -> bool:
    """Whether a launch on the v4 consumers (``one_loop``) writes out through TMA (``configs.FORWARD_STORE_TMA``)."""
    return configs.FORWARD_STORE_TMA and one_loop


def _call_setup(q, k, v, params, num_seqs: int, total_out: int):
    """(q, k, v TMA-ready, config, window_bounds, fwd_choices, uniform) of a call that launches the kernel.
    ``uniform``: every sequence has the same length (a dense batch), known without reading the offsets: the
    max_seqlen hints times B cover the rows."""
    q, k, v = _tma_ready(q), _tma_ready(k), _tma_ready(v)
    cfg = fwd_config(q.shape[2])
    bounds = window_bounds(params.causal, params.window_left, params.window_right)  # has_left, left, has_right, right
    uniform = uniform_lengths(params, num_seqs, total_out, k.shape[0])
    return q, k, v, cfg, bounds, fwd_choices(cfg, bounds[0] or bounds[2], params.broadcast_q, uniform), uniform


def uniform_lengths(params, num_seqs: int, total_q: int, total_kv: int) -> bool:
    """Every sequence has the same length (a dense batch), known without reading the offsets: the max_seqlen hints
    times B cover the rows (a broadcast Q: the key side alone)."""
    return params.max_seqlen_kv > 0 and params.max_seqlen_kv * num_seqs == total_kv and (
        params.broadcast_q or (params.max_seqlen_q > 0 and params.max_seqlen_q * num_seqs == total_q))


# Replays per call signature (``triton.attn_fwd._Replay`` with the q, k, v descriptors built per call, and out's with
# STORE_TMA): why: a small
# call's host time was ~4x the triton forward's (tools/host_backend_cpu.py --backend tlx; bench/NOTES.md "tlx host
# path"), nearly all of it derivation that the signature fixes (configs, choices, schedule, ~60 arguments bound and
# specialized). The key is the triton forward's (params, shapes, strides, device, offsets, knobs' generation) plus
# what only this path reads: the dtypes (TMA's row-stride rule is in bytes), this backend's overrides (configs.
# PIPELINE, KV_MAJOR, ONE_LOOP, FORWARD_ZIGZAG, FORWARD_HEAD_GROUP, FORWARD_STORE_TMA) and the head dim's config.
_REPLAYS: dict = {}
launcher.CLEAR_HOOKS.append(_REPLAYS.clear)


def _replay_key(q, k, v, q_offsets, kv_offsets, params) -> Optional[tuple]:
    key = triton_replay_key(q, k, v, q_offsets, kv_offsets, params)
    if key is None:
        return None
    return key + (q.dtype, k.dtype, v.dtype, configs.PIPELINE, configs.KV_MAJOR, configs.ONE_LOOP,
                  configs.FORWARD_ZIGZAG, configs.FORWARD_HEAD_GROUP, configs.FORWARD_DYNAMIC, fwd_config(q.shape[2]),
                  configs.FORWARD_STORE_TMA)


def _zigzag_order(wanted: bool, cfg, schedule: dict, programs: int, num_heads: int, num_heads_kv: int,
                  uniform: bool):
    """(ZIGZAG, head group) of a launch that ``wanted`` the zigzag order (``configs.FORWARD_ZIGZAG``,
    ``SPARSE_FORWARD_ZIGZAG``): not for one wave (no list: every item runs at once, the order cannot matter); D64/D128
    only (the v4 configs: D256's v3 consumers spilled 40-68 B more per thread with it, the others 0-4); the group from
    ``configs.fwd_head_group`` (it follows the list's capacity, which a launch plan's key does not hold)."""
    zigzag = wanted and cfg.one_loop and not schedule["TILES_FROM_OFFSETS"]
    return zigzag, configs.fwd_head_group(num_heads_kv, num_heads // num_heads_kv, schedule["n_slots"], programs,
                                          uniform) if zigzag else 1


def attention_forward(q, k, v, q_offsets, kv_offsets, params):
    """(out [T_q, Hq, D], lse [Hq, T_q] float32): the triton backend's contract (``jfa_ops.backends.base``)."""
    key = _replay_key(q, k, v, q_offsets, kv_offsets, params)
    result = replayed(_REPLAYS, key, q, k, v, q_offsets, kv_offsets)
    if result is not None:
        return result
    inputs = q, k, v
    device, num_seqs = q.device, kv_offsets.numel() - 1
    num_heads, head_dim = q.shape[1], q.shape[2]
    q_off, kv_off, total_out = kernel_offsets(q, q_offsets, kv_offsets, params.broadcast_q, params.check_offsets)
    out = common.alloc_output((total_out, num_heads, head_dim), q.dtype, device)
    lse = common.alloc_output((num_heads, total_out), torch.float32, device)
    flag_mode = validation.validation_mode(device) if params.check_offsets else None
    if total_out == 0 or num_seqs == 0 or k.shape[0] == 0:  # no kernel (a descriptor needs positive extents)
        out.zero_()
        lse.fill_(float("-inf"))
        if flag_mode is not None:
            validation.device_check(None if params.broadcast_q else q_offsets, q.shape[0], params.max_seqlen_q,
                                    kv_offsets, k.shape[0], params.max_seqlen_kv, flag_mode)
        return out, lse
    q, k, v, cfg, bounds, choices, uniform = _call_setup(q, k, v, params, num_seqs, total_out)
    has_left, window_left, has_right, right = bounds
    flag = torch.empty((1,), dtype=torch.int32, device=device) if flag_mode is not None else None
    max_q = -1 if params.broadcast_q else params.max_seqlen_q
    # configs.forward_dynamic (D256 by default; the env forces it either way): the v3 consumers' items from an atomic
    # counter, where a list is built (one wave: every item runs at once, nothing to balance)
    atomic = configs.forward_dynamic(head_dim) and not choices[2] and not tiles_from_offsets(
        capacity_of(total_out, cfg.block_m, num_seqs) * num_heads, num_seqs, 1, device)
    programs, schedule = tile_schedule(
        lambda **check: forward_tiles(q_off, kv_off, total_out, k.shape[0], cfg.block_m, window_left, right,
                                      has_left, has_right, **check),
        q_off, kv_off, total_out, k.shape[0], cfg.block_m, num_heads, "atomic" if atomic else "static", 1, device,
        **({} if flag is None else dict(flag=flag, max_s=max_q, max_o=params.max_seqlen_kv)))
    num_heads_kv = k.shape[1]
    # masked or jagged calls by default: triangles, bands and unequal sequences are what static striding unbalances
    zigzag, head_group = _zigzag_order(configs.forward_zigzag(has_left or has_right, uniform) and not atomic, cfg,
                                       schedule, programs, num_heads, num_heads_kv, uniform)
    if zigzag:  # its own order: KV_MAJOR unread, one specialization whatever the call would have picked
        choices = (choices[0], False, choices[2])
    dynamic = _dynamic_args(q, k, v, out, lse, q_off, kv_off, schedule, cfg, head_group, choices[2])
    plan_key = (q.dtype, num_heads, head_dim, num_heads_kv, params.scale, params.broadcast_q, bounds, choices, cfg,
                schedule["ATOMIC_WORK"], schedule["TILES_FROM_OFFSETS"], zigzag,
                configs.FORWARD_STORE_TMA)  # what _static_args follow from
    options = dict(num_warps=NUM_WARPS, num_stages=1)
    launch_planned(attn_fwd_tlx_kernel, plan_key, (programs,), dynamic,
                   lambda: dict(_static_args(num_heads, head_dim, num_heads_kv, cfg, params, bounds, choices,
                                             schedule, zigzag), **NO_SELECTION), **options)
    if flag is not None:
        if schedule["TILES_FROM_OFFSETS"]:  # no list was built, so nothing checked the offsets: aten ops do
            validation.device_check(None if params.broadcast_q else q_offsets, q.shape[0], params.max_seqlen_q,
                                    kv_offsets, k.shape[0], params.max_seqlen_kv, flag_mode)
        else:
            validation.device_flag(flag, flag_mode)
    elif (key is not None and key not in _REPLAYS and schedule["TILES_FROM_OFFSETS"] and not schedule["ATOMIC_WORK"]
          and all(a is b for a, b in zip((q, k, v), inputs))):  # one launch from the call's own tensors: a replay
        keep_replay(_REPLAYS, attn_fwd_tlx_kernel, key, plan_key, (programs,), dynamic,
                    (q, k, v, out, lse, q_off, kv_off, None, dynamic["desc_q"], dynamic["desc_k"], dynamic["desc_v"],
                     dynamic.get("desc_o")),
                    options, q_offsets, kv_offsets, descriptors=True)
    return out, lse


def block_sparse_forward(q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count, params):
    """(out, lse) of attention restricted to the selected KV blocks: the triton backend's ``block_sparse_forward``
    contract, on the TLX forward with SPARSE (each work item walks its Q block's selected tiles only); the work list
    is the triton kernel's (longest first by selected blocks), taken by static striding, or with
    ``configs.SPARSE_FORWARD_ZIGZAG`` in the dense forward's ZIGZAG order. ``configs.sparse_reason`` held for the
    block sizes; ``configs.SPARSE_FORWARD_UNIFORM_WALK``, ``SPARSE_FORWARD_ZIGZAG``, ``SPARSE_FORWARD_WALK_AHEAD``
    (``configs.sparse_walk_ahead``: off by default), ``SPARSE_FORWARD_ABLATE``, ``SPARSE_FORWARD_PEEL`` and
    ``SPARSE_FORWARD_FIRST_UNMASKED`` read per call."""
    device, num_seqs = q.device, kv_offsets.shape[0] - 1
    num_heads, head_dim = q.shape[1], q.shape[2]
    q_off, kv_off, total_out = sparse_offsets(q, q_offsets, kv_offsets, params.broadcast_q)
    out = common.alloc_output((total_out, num_heads, head_dim), q.dtype, device)
    lse = common.alloc_output((num_heads, total_out), torch.float32, device)
    if total_out == 0 or num_seqs == 0 or k.shape[0] == 0:  # no kernel (a descriptor needs positive extents)
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    q, k, v, cfg, bounds, (_, kv_major, _), uniform = _call_setup(q, k, v, params, num_seqs, total_out)
    has_left, window_left, has_right, right = bounds
    index, count = kv_block_index.contiguous(), kv_block_count.contiguous()
    if index.numel() * (params.block_kv // cfg.block_n) >= 2 ** 31:  # _selected_item's int32 tile positions
        raise ValueError(f"kv_block_index has {index.numel()} entries: too many for the tlx block-sparse forward "
                         f"(backend='triton' runs it while each sequence's kv heads x Q blocks x KV blocks stay under 2**31; "
                         f"backend='reference' past that)")
    cost = selected_cost_args(count, params.block_q)  # the list's order: longest first by selected blocks
    programs, schedule = tile_schedule(
        lambda: forward_tiles(q_off, kv_off, total_out, k.shape[0], cfg.block_m, window_left, right, has_left,
                              has_right, **cost),
        q_off, kv_off, total_out, k.shape[0], cfg.block_m, num_heads, "static", 1, device)
    zigzag, head_group = _zigzag_order(configs.SPARSE_FORWARD_ZIGZAG, cfg, schedule, programs, num_heads, k.shape[1],
                                       uniform)
    launch(attn_fwd_tlx_kernel, (programs,), dict(
        **_dynamic_args(q, k, v, out, lse, q_off, kv_off, schedule, cfg, head_group, True),
        **_static_args(num_heads, head_dim, k.shape[1], cfg, params, bounds, (False, kv_major and not zigzag, True),
                       schedule, zigzag),
        BLOCK_INDEX=index, BLOCK_COUNT=count, n_q_blocks=index.shape[2], **index_strides("i", "c", index, count),
        SPARSE=True, BLOCK_Q=params.block_q, BLOCK_KV=params.block_kv,
        UNIFORM_WALK=configs.SPARSE_FORWARD_UNIFORM_WALK, WALK_AHEAD=configs.sparse_walk_ahead(has_left or has_right),
        SPARSE_ABLATE=configs.SPARSE_FORWARD_ABLATE,
        SPARSE_PEEL=configs.SPARSE_FORWARD_PEEL and not configs.SPARSE_FORWARD_ABLATE,
        FIRST_UNMASKED=configs.on_for_call(configs.SPARSE_FORWARD_FIRST_UNMASKED, has_left or has_right)
        and not configs.SPARSE_FORWARD_ABLATE),
        num_warps=NUM_WARPS, num_stages=1)
    return out, lse
